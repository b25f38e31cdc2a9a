#!/usr/bin/env python3
"""Compile-only check of the CUDA sources the patch series adds or changes, for machines with nvcc
and no GPU (CI). It compiles, with the flags of ggml-cuda's CMake build, for every --arch in one nvcc
run a file (a run per --arch to name the failing ones when it fails):

- every .cu file under ggml/src/ggml-cuda/ that a patches/*.patch adds or changes (read from the
  patches' `diff --git` lines, not from the tree's history);
- ggml-cuda.cu, the dispatch, when a patch changes a .cuh header there.

Template instances the series does not touch are left out, so it takes minutes, not the hour of a
whole ggml-cuda build. Nothing is linked and no object is kept: a patch that breaks nvcc or ptxas
for sm_86 or sm_90 fails here.

ggml-cuda.cu includes cublas_v2.h, which the CUDA toolkit on CI lacks. It is used from the toolkit
when there, else taken from PyPI's nvidia-cublas wheel without downloading the wheel's 400+ MB: the
wheel is a zip, read through HTTP Range requests (its central directory, then the headers alone),
and the headers are cached (--cache) for the next run.

    python3 scripts/cuda_compile_check.py [--tree vendor/llama.cpp] [--arch 86,90] [--jobs 2]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import requests

REPO = Path(__file__).resolve().parent.parent
CUDA_DIR = "ggml/src/ggml-cuda/"
DISPATCH = CUDA_DIR + "ggml-cuda.cu"
PYPI_JSON = "https://pypi.org/pypi/nvidia-cublas/json"
CUBLAS_HEADER = "cublas_v2.h"
MARKER = "wheel.json"
HTTP_TIMEOUT = 30.0
MAX_ERROR_LINES = 200  # of one failed compile's output

# What ggml-cuda's CMake build (ggml/src/ggml-cuda/CMakeLists.txt, ggml/src/CMakeLists.txt) passes
# nvcc for a Release build with buun's options (buun_tool/pipeline/build.py: GGML_CUDA_FA on, shared
# libraries, llama.cpp's default of CUDA graphs on). Left out: GGML_CUDA_FA_ALL_QUANTS (it chooses
# template instances, which this check does not compile), GGML_USE_NCCL (NCCL's headers are not on
# CI), -compress-mode (it only shapes the fatbin, which is thrown away), -fPIC.
NVCC_FLAGS = ("-std=c++17", "-O3", "-use_fast_math", "-extended-lambda", "-Xcompiler", "-Wno-pedantic")
DEFINES = ("NDEBUG", "GGML_BACKEND_BUILD", "GGML_BACKEND_SHARED", "GGML_SHARED", "GGML_CUDA_USE_GRAPHS",
           "GGML_SCHED_MAX_COPIES=4", "_GNU_SOURCE", "_XOPEN_SOURCE=600")
INCLUDE_DIRS = ("ggml/include", "ggml/src", "ggml/src/ggml-cuda")


class CheckError(Exception):
    """A failure with a message for the user (what happened and what to do)."""


# --- which files --------------------------------------------------------------------------------

_DIFF_LINE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def series_paths(patches_dir: Path) -> dict[str, bool]:
    """Every path the patches in `patches_dir` touch, in series order, mapped to whether it still
    exists once the whole series is applied (a later patch may delete or rename it)."""
    patches = sorted(patches_dir.glob("*.patch"))
    if not patches:
        raise CheckError(f"no patches in {patches_dir}")
    state: dict[str, bool] = {}
    for patch in patches:
        current: tuple[str, str] | None = None
        for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
            m = _DIFF_LINE.match(line)
            if m:
                current = (m.group(1), m.group(2))
                state[current[1]] = True
                continue
            if current is None:
                continue
            if line.startswith("deleted file mode"):
                state[current[0]] = False
            elif line.startswith("rename from ") and current[0] != current[1]:
                state[current[0]] = False
    return state


def files_to_compile(patches_dir: Path) -> list[str]:
    """The .cu files under ggml/src/ggml-cuda/ that the series adds or changes, plus ggml-cuda.cu
    when it changes a .cuh there; paths relative to the llama.cpp tree, sorted."""
    state = series_paths(patches_dir)
    touched = [p for p in state if p.startswith(CUDA_DIR)]
    files = {p for p in touched if p.endswith(".cu") and state[p]}
    if any(p.endswith(".cuh") for p in touched):
        files.add(DISPATCH)
    return sorted(files)


def changed_headers(patches_dir: Path) -> list[str]:
    """The .cuh headers under ggml/src/ggml-cuda/ that the series leaves added or changed."""
    return sorted(p for p, exists in series_paths(patches_dir).items()
                  if exists and p.startswith(CUDA_DIR) and p.endswith(".cuh"))


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _includes(tree: Path, rel: str, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """The tree's files that `rel` includes, directly or not (quoted includes, resolved as nvcc
    would with the check's -I dirs), as paths relative to the tree."""
    if rel in memo:
        return memo[rel]
    memo[rel] = frozenset()  # a cycle ends here
    found: set[str] = set()
    text = (tree / rel).read_text(encoding="utf-8", errors="replace")
    for name in _INCLUDE.findall(text):
        for base in (str(Path(rel).parent), *INCLUDE_DIRS):
            path = os.path.normpath(os.path.join(base, name))
            if (tree / path).is_file():
                found |= {path, *_includes(tree, path, memo)}
                break
    memo[rel] = frozenset(found)
    return memo[rel]


def instances_for(tree: Path, headers: Sequence[str]) -> dict[str, str]:
    """One template instance (ggml/src/ggml-cuda/template-instances/*.cu) for each of `headers`
    that instances include and not all of them (common.cuh is in every one; the series' own .cu
    files compile it): the first instance by name that includes it, unless one chosen for another
    header does. The dispatch files do not instantiate a header's kernel templates (mmq.cuh's, and
    the mmq-config-*.cuh tables they read): the instances do. Maps each instance to the headers it
    covers."""
    memo: dict[str, frozenset[str]] = {}
    inst_dir = tree / CUDA_DIR / "template-instances"
    instances = {str(p.relative_to(tree)): _includes(tree, str(p.relative_to(tree)), memo)
                 for p in sorted(inst_dir.glob("*.cu"))}
    if not instances:
        return {}
    everywhere = frozenset.intersection(*instances.values())
    chosen: dict[str, list[str]] = {}
    for header in headers:
        if header in everywhere:
            continue
        covering = [i for i, inc in instances.items() if header in inc]
        if not covering:
            continue
        already = [i for i in chosen if i in covering]
        chosen.setdefault(already[0] if already else covering[0], []).append(header)
    return {i: ", ".join(Path(h).name for h in hs) for i, hs in chosen.items()}


# --- cuBLAS's headers ---------------------------------------------------------------------------

class RangeError(CheckError):
    """The server did not answer a Range request with the part asked for."""


class RangeReader(io.RawIOBase):
    """A read-only, seekable file over HTTP: each read that misses its buffer is one Range GET of at
    least `block` bytes, so a zipfile.ZipFile over it fetches the zip's end (the end-of-central-
    directory record and, mostly, the central directory with it) and then only the members it
    opens. `fetched` counts the bytes received, `requests` the GETs."""

    def __init__(self, url: str, session: requests.Session | None = None, block: int = 64 * 1024,
                 timeout: float = HTTP_TIMEOUT) -> None:
        super().__init__()
        self.url = url
        self.block = block
        self.timeout = timeout
        self.fetched = 0
        self.requests = 0
        self._session = session or requests.Session()
        self._pos = 0
        # The first GET is for the last `block` bytes: it gives the size and the zip's directory.
        self._buf_start, self._buf, self.size = self._get(f"bytes=-{block}")

    def _get(self, spec: str) -> tuple[int, bytes, int]:
        headers = {"Range": spec, "Accept-Encoding": "identity"}
        with self._session.get(self.url, headers=headers, stream=True, timeout=self.timeout) as r:
            self.requests += 1
            if r.status_code != 206:
                raise RangeError(f"{self.url}: answered {r.status_code} to a Range request ({spec}), "
                                 "not 206 Partial Content")
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", r.headers.get("Content-Range", ""))
            if not m:
                raise RangeError(f"{self.url}: a 206 without a usable Content-Range "
                                 f"({r.headers.get('Content-Range')!r})")
            data = r.content
        start, end, total = (int(g) for g in m.groups())
        if len(data) != end - start + 1:
            raise RangeError(f"{self.url}: {len(data)} bytes for the range {start}-{end}")
        self.fetched += len(data)
        return start, data, total

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(b).cast("B")
        want = min(len(out), max(0, self.size - self._pos))
        done = 0
        while done < want:
            pos = self._pos + done
            offset = pos - self._buf_start
            if not 0 <= offset < len(self._buf):
                end = min(self.size, pos + max(want - done, self.block))
                start = max(0, min(pos, end - self.block))  # near the end, read back a whole block
                self._buf_start, self._buf, _ = self._get(f"bytes={start}-{end - 1}")
                offset = pos - self._buf_start
            n = min(want - done, len(self._buf) - offset)
            out[done:done + n] = self._buf[offset:offset + n]
            done += n
        self._pos += done
        return done


@dataclass
class Headers:
    include: Path  # the directory that holds cublas_v2.h
    source: str  # where it came from, for the log
    downloaded: int = 0  # bytes fetched this run


def _safe_relative(name: str) -> Path:
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckError(f"refusing the zip member {name!r}: it would land outside the cache")
    return rel


def extract_include_dir(reader: RangeReader, dest: Path, header: str = CUBLAS_HEADER) -> list[str]:
    """Extracts the members of the zip behind `reader` that lie in the directory holding `header`
    into `dest` (paths relative to that directory); returns the members' names."""
    with zipfile.ZipFile(reader) as zf:
        holders = [n for n in zf.namelist() if n == header or n.endswith("/" + header)]
        if not holders:
            raise CheckError(f"{reader.url}: no {header} in the wheel")
        prefix = holders[0][: -len(header)]
        members = [i for i in zf.infolist() if i.filename.startswith(prefix) and not i.is_dir()]
        for info in members:
            target = dest / _safe_relative(info.filename[len(prefix):])
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    return [i.filename for i in members]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def choose_wheel(index: dict[str, object], cuda: tuple[int, int], index_url: str) -> tuple[str, str]:
    """(filename, URL) of a manylinux x86_64 wheel from PyPI's JSON for nvidia-cublas: a final
    release of the CUDA major version `cuda[0]`, the newest of nvcc's major.minor if there is one,
    else the newest of the major."""
    releases = index.get("releases")
    if not isinstance(releases, dict):
        raise CheckError(f"{index_url}: no releases in the answer")
    candidates: list[tuple[tuple[int, ...], str, str]] = []
    for version, files in releases.items():
        if not re.fullmatch(r"\d+(\.\d+)+", version) or _version_key(version)[0] != cuda[0]:
            continue
        for f in files:
            name = str(f.get("filename", ""))
            if "manylinux" in name and name.endswith("x86_64.whl") and not f.get("yanked"):
                candidates.append((_version_key(version), name, urljoin(index_url, str(f["url"]))))
                break
    if not candidates:
        raise CheckError(f"{index_url}: no manylinux x86_64 wheel of nvidia-cublas for CUDA {cuda[0]}")
    same_minor = [c for c in candidates if c[0][:2] == cuda]
    _, name, url = max(same_minor or candidates)
    return name, url


def system_cublas_dirs(nvcc: str | None) -> list[Path]:
    """Where a toolkit keeps cublas_v2.h: /usr/local/cuda/include, and nvcc's own include dirs."""
    dirs = [Path("/usr/local/cuda/include")]
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                                 capture_output=True, text=True, timeout=60).stderr
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            if line.startswith("#$ INCLUDES="):
                dirs += [Path(p) for p in re.findall(r'"-I([^"]+)"', line)]
    return dirs


def cublas_headers(cache: Path, cuda: tuple[int, int], search: Iterable[Path] = (),
                   index_url: str = PYPI_JSON, session: requests.Session | None = None) -> Headers:
    """A directory with cublas_v2.h: a toolkit's (in `search`), else the cache's, else fetched from
    the nvidia-cublas wheel into the cache."""
    for d in search:
        if (d / CUBLAS_HEADER).is_file():
            return Headers(d, f"the toolkit ({d})")
    marker = cache / MARKER
    include = cache / "include"
    if marker.is_file() and (include / CUBLAS_HEADER).is_file():
        try:
            meta = json.loads(marker.read_text())
        except ValueError:
            meta = {}
        if meta.get("cuda_major") == cuda[0]:
            return Headers(include, f"the cache ({cache}, from {meta.get('wheel')})")
    session = session or requests.Session()
    try:
        r = session.get(index_url, timeout=HTTP_TIMEOUT)
        r.raise_for_status()
        index_bytes = len(r.content)
        name, url = choose_wheel(r.json(), cuda, index_url)
        print(f"cuBLAS headers: fetching the include directory of {name} with Range requests", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
            reader = RangeReader(url, session=session)
            members = extract_include_dir(reader, Path(tmp) / "include")
            shutil.rmtree(include, ignore_errors=True)
            os.replace(Path(tmp) / "include", include)
    except zipfile.BadZipFile as e:
        raise CheckError(f"{url}: not a readable zip ({e})") from e
    except requests.RequestException as e:
        raise CheckError(
            f"cuBLAS's headers ({CUBLAS_HEADER}) are not in the CUDA toolkit nor cached in {cache}, and "
            f"fetching them from PyPI failed: {e}\n"
            f"What to do: run this once on a machine with network access (the cache is {cache}; it "
            f"can be copied), or install the toolkit's cuBLAS headers (e.g. apt-get install "
            f"libcublas-dev-{cuda[0]}-{cuda[1]}), or pass --cublas-include DIR with a directory that "
            f"holds {CUBLAS_HEADER}.") from e
    meta = {"wheel": name, "url": url, "cuda_major": cuda[0], "members": len(members),
            "bytes_fetched": reader.fetched, "wheel_bytes": reader.size}
    marker.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"cuBLAS headers: {len(members)} files, {reader.fetched:,} bytes of the wheel downloaded in "
          f"{reader.requests} Range requests (the wheel is {reader.size:,}; PyPI's index: {index_bytes:,} "
          f"bytes), cached in {include}", flush=True)
    return Headers(include, f"{name} (fetched)", reader.fetched + index_bytes)


# --- compiling -----------------------------------------------------------------------------------

def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in homes:
        if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            return str(Path(home) / "bin" / "nvcc")
    return None


def nvcc_version(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise CheckError(f"{nvcc} --version: no 'release X.Y' in its output:\n{out}")
    return int(m.group(1)), int(m.group(2))


def nvcc_command(nvcc: str, tree: Path, source: str, arches: Sequence[str],
                 extra_includes: Sequence[Path]) -> list[str]:
    return [nvcc, "-c", "-o", os.devnull, *NVCC_FLAGS,
            *(x for a in arches for x in ("-gencode", f"arch=compute_{a},code=sm_{a}")),
            *(f"-D{d}" for d in DEFINES),
            *(f"-I{tree / d}" for d in INCLUDE_DIRS),
            *(f"-I{d}" for d in extra_includes),
            str(tree / source)]


@dataclass
class Result:
    source: str
    arches: tuple[str, ...]
    seconds: float
    rc: int
    output: str

    @property
    def sm(self) -> str:
        return ", ".join(f"sm_{a}" for a in self.arches)


def compile_one(nvcc: str, tree: Path, source: str, arches: Sequence[str],
                extra_includes: Sequence[Path]) -> Result:
    start = time.monotonic()
    # nvcc's temporaries go to a directory of this compile's own, removed after
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as tmp:
        p = subprocess.run(nvcc_command(nvcc, tree, source, arches, extra_includes), capture_output=True,
                           text=True, env={**os.environ, "TMPDIR": tmp})
    return Result(source, tuple(arches), time.monotonic() - start, p.returncode, (p.stdout + p.stderr).strip())


def compile_file(nvcc: str, tree: Path, source: str, arches: Sequence[str],
                 extra_includes: Sequence[Path]) -> list[Result]:
    """One nvcc run for every architecture (the host side and the front end once: 13.3 s for
    top-k.cu against 21.6 in a run per architecture); when it fails, a run per architecture, so
    that the report says which of them fail."""
    together = compile_one(nvcc, tree, source, arches, extra_includes)
    if together.rc == 0 or len(arches) == 1:
        return [together]
    alone = [compile_one(nvcc, tree, source, [a], extra_includes) for a in arches]
    # a failure that no run alone repeats still fails the check: CMake's build compiles every
    # architecture of CMAKE_CUDA_ARCHITECTURES in one run, as `together` did
    return alone if any(r.rc for r in alone) else [together, *alone]


def _tail(text: str, limit: int = MAX_ERROR_LINES) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    return "\n".join([f"[... {len(lines) - limit} lines before ...]", *lines[-limit:]])


def run_compiles(nvcc: str, tree: Path, files: Sequence[str], arches: Sequence[str], jobs: int,
                 extra_includes: Sequence[Path]) -> list[Result]:
    # the biggest (with what they include) first, so the long ones start early and the small ones
    # fill in around them
    memo: dict[str, frozenset[str]] = {}
    cost = {f: sum((tree / g).stat().st_size for g in {f, *_includes(tree, f, memo)}) for f in files}
    work = sorted(files, key=lambda f: -cost[f])
    width = max(len(f) for f in files)
    results: list[Result] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(compile_file, nvcc, tree, f, arches, extra_includes) for f in work]
        for fut in as_completed(futures):
            for r in fut.result():
                results.append(r)
                status = "ok  " if r.rc == 0 else "FAIL"
                note = "" if r.rc or not r.output else f"  ({len(r.output.splitlines())} lines of warnings below)"
                print(f"  {status} {r.sm:<14} {r.source:<{width}} {r.seconds:6.1f} s{note}", flush=True)
                if r.output and r.rc == 0:
                    print(_tail(r.output), flush=True)
    return results


# --- main ----------------------------------------------------------------------------------------

def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "buun" / "cuda-headers"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Compile-only check (nvcc, no GPU) of the CUDA sources the patch "
                                             "series adds or changes; see the module's docstring.")
    ap.add_argument("--tree", type=Path, default=REPO / "vendor" / "llama.cpp",
                    help="a llama.cpp source tree with the series applied (default: vendor/llama.cpp)")
    ap.add_argument("--patches", type=Path, default=REPO / "patches",
                    help="the series whose files are compiled (default: the repository's patches/)")
    ap.add_argument("--arch", default="86,90", help="compute capabilities, comma-separated (default: 86,90)")
    ap.add_argument("--jobs", type=int, default=2, help="compiles at once (default: 2)")
    ap.add_argument("--cache", type=Path, default=default_cache(),
                    help="where cuBLAS's headers are cached (default: $XDG_CACHE_HOME/buun/cuda-headers)")
    ap.add_argument("--cublas-include", type=Path, help="a directory holding cublas_v2.h, instead of fetching")
    ap.add_argument("--skip-without-nvcc", action="store_true", help="exit 0 when there is no nvcc")
    return ap.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not arches or not all(re.fullmatch(r"\d{2,3}[af]?", a) for a in arches):
        print(f"cuda compile check: --arch {args.arch!r} is not a list like 86,90", file=sys.stderr)
        return 2
    nvcc = find_nvcc()
    if nvcc is None:
        if args.skip_without_nvcc:
            print("cuda compile check: skipped: no nvcc")
            return 0
        print("cuda compile check: no nvcc (not on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin): install the CUDA "
              "toolkit, or pass --skip-without-nvcc to skip the check", file=sys.stderr)
        return 2
    try:
        files = files_to_compile(args.patches)
        headers_changed = changed_headers(args.patches)
        tree = args.tree.resolve()
        if not (tree / CUDA_DIR).is_dir():
            raise CheckError(f"no llama.cpp tree at {tree} (no {CUDA_DIR}): `make llama` fetches and patches "
                             "vendor/llama.cpp, or pass --tree")
        missing = [f for f in (*files, *headers_changed) if not (tree / f).is_file()]
        if missing:
            raise CheckError(f"{tree} lacks {', '.join(missing)}, which the series ends with: is it a llama.cpp tree "
                             "with the series applied? (`make llama` makes vendor/llama.cpp one)")
        instances = instances_for(tree, headers_changed)
        cuda = nvcc_version(nvcc)
        print(f"cuda compile check: {nvcc} (CUDA {cuda[0]}.{cuda[1]}), {tree}, sm_{', sm_'.join(arches)}, "
              f"{args.jobs} at once; the files:")
        for f in files:
            print(f"  {f}")
        for f, covers in instances.items():
            print(f"  {f}  (one instance of {covers}, which the series changes)")
        files = [*files, *instances]
        if not files:
            print("cuda compile check: the series changes no CUDA source; nothing to do")
            return 0
        if args.cublas_include:
            if not (args.cublas_include / CUBLAS_HEADER).is_file():
                raise CheckError(f"--cublas-include {args.cublas_include}: no {CUBLAS_HEADER} there")
            headers = Headers(args.cublas_include, "--cublas-include")
        else:
            headers = cublas_headers(args.cache, cuda, system_cublas_dirs(nvcc))
        print(f"cuBLAS headers: {headers.include}, from {headers.source}", flush=True)
    except CheckError as e:
        print(f"cuda compile check: {e}", file=sys.stderr)
        return 2
    start = time.monotonic()
    results = run_compiles(nvcc, tree, files, arches, args.jobs, [headers.include])
    wall = time.monotonic() - start
    failed = [r for r in results if r.rc != 0]
    for r in sorted(failed, key=lambda r: (r.source, r.arches)):
        print(f"\n--- {r.source} for {r.sm} failed (exit {r.rc}):\n{_tail(r.output)}", file=sys.stderr)
    bad = {r.source for r in failed}
    print(f"cuda compile check: {len(files) - len(bad)} of {len(files)} files compiled for sm_{', sm_'.join(arches)} "
          f"in {wall:.0f} s wall, {sum(r.seconds for r in results):.0f} s of compiles"
          + (f"; FAILED: {', '.join(f'{r.source} ({r.sm})' for r in failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
