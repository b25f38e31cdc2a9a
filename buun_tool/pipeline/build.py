"""Stage: build the patched llama.cpp (CUDA when a GPU and nvcc are there, CPU otherwise), and
on request (`buun build --upstream`) the unpatched pin beside it, for `buun bench --against upstream`.

Only the targets buun runs are built. A stamp of everything that shapes the binaries (pin,
source tree, flags, arch, compiler) sits next to them: an unchanged rebuild returns in seconds,
and other stages find the binaries through `find_binary` (`find_upstream_binary`), never by path.
The upstream build compiles an export of the vendored repo's tag `buun-baseline` (the pin) under
the build folder, with the same flags; the patched tree is not touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from buun_tool.base import console, locks, nvidia, paths
from buun_tool.base.errors import BuunError, NotReadyError, UsageError
from buun_tool.base.proc import git, run, run_logged
from buun_tool.pipeline import patches, vendor
from buun_tool.pipeline.stage import StageStatus, current, stale

# the tree patches' checks (CI on the CPU build, `scripts/gpu_run.sh tree-ops` on CUDA): test-tree-ssm the ops
# of 0001 on every backend of the build, test-ddtree the builder of 0020, test-tree-decode 0021
TARGETS = ("llama-server", "llama-quantize", "llama-cli", "llama-bench", "llama-speculative-simple",
           "ggml-rpc-server", "test-tree-ssm", "test-ddtree", "test-tree-decode")
VARIANTS = ("cuda", "cpu")
STAMP = "buun-build.json"
UPSTREAM = "upstream"  # the unpatched pin's build folders: upstream-cpu, upstream-cuda; its source: upstream-src
UPSTREAM_TARGETS = ("llama-server", "llama-bench")  # what `buun bench --against upstream` runs
# The fork's CUDA flags: flash attention for every KV cache type the recipes may choose.
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DGGML_NATIVE=ON", "-DGGML_CUDA_FA=ON", "-DGGML_CUDA_FA_ALL_QUANTS=ON")
CPU_FLAGS = ("-DGGML_CUDA=OFF", "-DGGML_NATIVE=ON")
# The CPU build (tests, GPU-less machines) leaves out ggml's AMX kernels: on Sapphire Rapids VMs
# their matmul crashes (SIGSEGV/SIGILL in ggml_backend_amx_mul_mat) on the qwen35 tensors, even
# with the tile permission granted. AVX-512 serves the CPU path well enough.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CPU_X86_FLAGS = (f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=ON",  # only the named targets build: the series' own tests live in tests/
    "-DLLAMA_BUILD_EXAMPLES=ON",  # llama-speculative-simple lives in examples/
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DGGML_RPC=ON",  # llama-server's --rpc and ggml-rpc-server, which `buun worker` runs on other machines
)
# Which C++ targets compile as unity builds (a cmake file of buun's, included by the configure):
# fewer, larger compiler runs, each parsing the headers its sources share once.
UNITY_CMAKE = Path(__file__).resolve().parents[1] / "data" / "unity.cmake"
# GB of memory one compile job may take: nvcc on the FA kernels is the hungry one.
MEM_PER_JOB_GB = {"cuda": 3.0, "cpu": 1.0}


def nvcc_release(version: str) -> tuple[int, int] | None:
    """The CUDA release in an nvcc's --version text (`release 13.0`), or None."""
    m = re.search(r"release (\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/opt/cuda/bin/nvcc") if os.access(p, os.X_OK)), None)


def _online(host: str = "huggingface.co") -> bool:
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


def ui_mode() -> str:
    """How the server's web UI gets into the binary: built from the pinned source with npm,
    upstream's prebuilt download, or not at all (then `doctor` says so)."""
    if shutil.which("npm"):
        return "build"
    return "prebuilt" if _online() else "none"


_UI_FLAGS = {
    "build": ("-DLLAMA_BUILD_UI=ON", "-DLLAMA_USE_PREBUILT_UI=OFF"),
    "prebuilt": ("-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=ON"),
    "none": ("-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"),
}


@dataclass
class BuildPlan:
    variant: str
    arch: str | None
    ui: str
    jobs: int
    generator: str
    cmake_args: list[str] = field(default_factory=list)
    targets: tuple[str, ...] = TARGETS
    upstream: bool = False  # the unpatched pin, beside the patched build

    @property
    def name(self) -> str:
        """The build folder's name: the variant, or upstream-VARIANT."""
        return f"{UPSTREAM}-{self.variant}" if self.upstream else self.variant

    @property
    def build_dir(self) -> Path:
        return paths.build_dir(self.name)

    def for_upstream(self) -> BuildPlan:
        """The same build (variant, arch, UI, flags, jobs) of the unpatched pin, with what bench runs."""
        return replace(self, targets=UPSTREAM_TARGETS, upstream=True)


def choose_variant(cpu: bool, cuda: bool) -> str:
    if cpu and cuda:
        raise UsageError("--cpu and --cuda exclude each other")
    if cpu:
        return "cpu"
    if cuda:
        if not find_nvcc():
            raise NotReadyError("--cuda needs the CUDA toolkit, but nvcc was not found",
                                "install the CUDA toolkit (nvcc) or build with --cpu")
        return "cuda"
    return "cuda" if nvidia.detect_gpus() and find_nvcc() else "cpu"


def default_jobs(variant: str) -> int:
    cores = os.cpu_count() or 1
    free_gb = psutil.virtual_memory().available / 2**30
    return max(1, min(cores, int(free_gb // MEM_PER_JOB_GB[variant])))


def plan(cpu: bool = False, cuda: bool = False, arch: str | None = None, jobs: int | None = None,
         ui: str | None = None) -> BuildPlan:
    variant = choose_variant(cpu, cuda)
    if variant == "cuda" and not arch:
        # every card's arch, not the first's: a 3090 + 4090 host builds 86;89 (one binary runs on both)
        caps = sorted({g.arch for g in nvidia.detect_gpus()}, key=lambda a: (len(a), a))
        if not caps:
            raise UsageError("no GPU is visible to pick the CUDA architecture from",
                             "pass --cuda-arch (86 for an RTX 3090, 89 for Ada, 90 for H100)")
        arch = ";".join(caps)
    if arch and not re.fullmatch(r"\d{2,3}[a-z]?(;\d{2,3}[a-z]?)*", arch):
        raise UsageError(f"--cuda-arch {arch!r} is not a list of compute capabilities", "for example 86 or 86;90")
    ui = ui or ui_mode()
    if ui not in _UI_FLAGS:
        raise UsageError(f"unknown UI mode {ui!r}", f"valid: {', '.join(_UI_FLAGS)}")
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    args = ["-G", generator, *COMMON_FLAGS, *_UI_FLAGS[ui], f"-DCMAKE_PROJECT_INCLUDE={UNITY_CMAKE}"]
    if variant == "cuda":
        args += [*CUDA_FLAGS, f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    else:
        args += [*CPU_FLAGS, *(CPU_X86_FLAGS if platform.machine() in ("x86_64", "AMD64") else ())]
    if shutil.which("ccache"):
        langs = ("C", "CXX", "CUDA") if variant == "cuda" else ("C", "CXX")
        args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in langs]
    return BuildPlan(variant, arch if variant == "cuda" else None, ui, jobs or default_jobs(variant),
                     generator, args)


def upstream_plan(jobs: int | None = None) -> BuildPlan:
    """The upstream build of what `buun build` built here (its variant, CUDA arch and UI, from its
    stamp), so the two differ by the patches alone."""
    for variant in VARIANTS:
        stamp = read_stamp(variant)
        if stamp is not None:
            arch = stamp.get("arch")
            return plan(cpu=variant == "cpu", cuda=variant == "cuda", arch=str(arch) if arch else None, jobs=jobs,
                        ui=str(stamp.get("ui"))).for_upstream()
    raise NotReadyError("buun's llama.cpp is not built: the upstream build copies its settings",
                        "run `buun build` first, or give the settings: `buun build --upstream --cpu` "
                        "(or --cuda-arch N)")


def _compiler_version() -> str:
    cc = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cc:
        raise NotReadyError("no C++ compiler found", "install one: apt-get install build-essential")
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def source_state(src: Path) -> dict[str, object]:
    """What the source tree is: its HEAD tree and a hash of any uncommitted edits."""
    head_tree = git(src, "rev-parse", "HEAD^{tree}")
    diff = subprocess.run(["git", "-C", str(src), "diff", "HEAD", "--binary"], capture_output=True).stdout
    applied = git(src, "log", "--format=%s", f"{vendor.BASELINE_TAG}..HEAD")
    return {
        "tree": head_tree,
        "uncommitted": hashlib.sha256(diff).hexdigest()[:16] if diff else None,
        "commits": applied.splitlines()[::-1],
    }


def baseline_state(repo: Path) -> dict[str, object]:
    """source_state's record of the pin as upstream ships it (the tag buun-baseline)."""
    return {"tree": git(repo, "rev-parse", f"{vendor.BASELINE_TAG}^{{tree}}"), "uncommitted": None, "commits": []}


def upstream_source() -> Path:
    """The pin as upstream ships it, for the upstream build: the vendored repo's tag buun-baseline
    exported (`git archive`) into the build folder's upstream-src, made again when the tag's tree
    changes. The vendored (patched) tree and its repository are only read.

    The upstream builds of two variants share it: one exports while the other waits, then finds it
    made. Once made it stays while they compile: only a moved tag makes it again, and the tag moves
    with `buun vendor`, which waits for every build."""
    repo = vendor.require_vendored()
    tree = str(baseline_state(repo)["tree"])
    dest = paths.build_dir(f"{UPSTREAM}-src")
    with locks.upstream_source(dest):
        return _export_baseline(repo, tree, dest)


def _export_baseline(repo: Path, tree: str, dest: Path) -> Path:
    marker = dest / ".buun-tree"  # the tree it holds, written last: a cut export is made again
    if marker.is_file() and marker.read_text().strip() == tree:
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", vendor.BASELINE_TAG],
                               stdout=subprocess.PIPE)
    assert archive.stdout is not None
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(tmp)  # noqa: S202 (our own repository's tree)
    if archive.wait() != 0:
        raise BuunError(f"git archive {vendor.BASELINE_TAG} failed in {repo}",
                        "`buun vendor` fetches the pin again (the tag marks it)")
    (tmp / marker.name).write_text(tree + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _stamp_for(p: BuildPlan, src: Path) -> dict[str, object]:
    nvcc = find_nvcc() if p.variant == "cuda" else None
    return {
        "pin": vendor.load_pin().commit,
        "source": baseline_state(vendor.require_vendored()) if p.upstream else source_state(src),
        "upstream": p.upstream,
        "variant": p.variant,
        "arch": p.arch,
        "ui": p.ui,
        "cmake_args": [a for a in p.cmake_args if "LAUNCHER" not in a],
        "unity": hashlib.sha256(UNITY_CMAKE.read_bytes()).hexdigest()[:16],
        "compiler": _compiler_version(),
        "nvcc": run([nvcc, "--version"]).stdout.strip().splitlines()[-1] if nvcc else None,
        "targets": list(p.targets),
    }


def read_stamp(name: str) -> dict[str, object] | None:
    """The stamp of a build folder (a variant, or upstream-VARIANT); None while it has none."""
    f = paths.build_dir(name) / STAMP
    try:
        return json.loads(f.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def variant_of(binary: Path) -> str | None:
    """The variant (cuda, cpu) of the build a binary comes from, by the stamp beside its bin
    folder; None when there is none (a binary built elsewhere)."""
    try:
        stamp = json.loads((binary.parent.parent / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    variant = stamp.get("variant") if isinstance(stamp, dict) else None
    return str(variant) if variant else None


def _missing_binaries(name: str, targets: tuple[str, ...] | list[str]) -> list[str]:
    return [t for t in targets if not (paths.build_dir(name) / "bin" / t).is_file()]


@dataclass
class BuildResult:
    variant: str
    build_dir: Path
    rebuilt: bool
    seconds: float
    stamp: dict[str, object]

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["build_dir"] = str(self.build_dir)
        return d


# what each stamp key means, for the reason a build is stale
_STAMP_KEYS = {"pin": "the pin", "source": "the patched source tree", "upstream": "the source (patched or upstream)",
               "variant": "the variant", "arch": "the CUDA architecture", "ui": "the web UI mode",
               "cmake_args": "the cmake flags", "unity": "the unity build's targets", "compiler": "the compiler",
               "nvcc": "the CUDA toolkit", "targets": "the programs built"}


def _what(p: BuildPlan) -> str:
    return f"upstream llama.cpp (the pin, unpatched; {p.variant})" if p.upstream else f"llama.cpp ({p.variant})"


def stage_status(p: BuildPlan, stamp: dict[str, object] | None = None) -> StageStatus:
    """The build stage's own answer: current when the binaries of `p` are there and its stamp says
    they were built from the tree, flags and compiler as they are now."""
    try:
        want = stamp or _stamp_for(p, vendor.require_vendored())
    except BuunError as exc:  # no tree to build yet, or no compiler
        return stale(exc.message)
    have = read_stamp(p.name)
    if have is None:
        return stale(f"{_what(p)} is not built in {p.build_dir}")
    changed = [_STAMP_KEYS.get(k, k) for k in want if have.get(k) != want[k]]
    if changed:
        return stale(f"changed since the {p.name} build: {', '.join(changed)}")
    missing = _missing_binaries(p.name, p.targets)
    if missing:
        return stale(f"missing from {p.build_dir / 'bin'}: {', '.join(missing)}")
    return current(f"{_what(p)} is built in {p.build_dir}")


def variant_status(variant: str, stamp: dict[str, object]) -> StageStatus:
    """stage_status (as `buun setup` and `buun build` judge it) for the build of `variant` with the
    CUDA arch and web UI of its `stamp`: what `buun doctor` reports and `buun serve` warns of."""
    try:
        p = plan(cpu=variant == "cpu", cuda=variant == "cuda", arch=str(stamp.get("arch") or "") or None,
                 ui=str(stamp.get("ui") or "") or None)
    except BuunError as exc:  # no nvcc any more for the CUDA build, say
        return stale(exc.message)
    return stage_status(p)


def rebuild_command(variant: str) -> str:
    return f"buun build {'--cpu' if variant == 'cpu' else '--cuda'}"


def stale_warning(binary: Path) -> str | None:
    """One line when `binary` is of a build of buun's that variant_status finds stale (the patched
    tree, its flags or the compiler changed since): serving it runs the old code. None for a
    current build, and for binaries buun did not build (BUUN_LLAMA_BIN_DIR elsewhere)."""
    variant = variant_of(binary)
    if variant is None or binary.parent.resolve() != (paths.build_dir(variant) / "bin").resolve():
        return None
    status = variant_status(variant, read_stamp(variant) or {})
    if status.current:
        return None
    return (f"the {variant} build of llama.cpp is older than the patched source or its settings "
            f"({status.detail}): serving its old binaries; run `{rebuild_command(variant)}`")


def build(p: BuildPlan, force: bool = False) -> BuildResult:
    # the tree is only read (builds of two variants run side by side; a patch or vendor waits), the
    # folder is this build's: two cmake and ninja runs in one folder clobber each other's files
    with locks.vendor_tree(shared=True), locks.build_folder(p.name):
        return _build(p, force)


def _build(p: BuildPlan, force: bool) -> BuildResult:
    if p.upstream:
        src = upstream_source()
    else:
        src = vendor.require_vendored()
        patches.require_applied()  # before anything is configured or compiled
    stamp = _stamp_for(p, src)
    bdir = p.build_dir
    what = _what(p)
    if not force and stage_status(p, stamp).current:
        console.ok(f"{what} is up to date in {bdir}")
        return BuildResult(p.name, bdir, False, 0.0, stamp)
    t0 = time.monotonic()
    bdir.mkdir(parents=True, exist_ok=True)
    (bdir / STAMP).unlink(missing_ok=True)  # a failed build must not look finished
    log = bdir / "build.log"
    log.write_text("")
    env = {"CCACHE_BASEDIR": str(paths.project_root())}
    hint = ("see the log; `buun doctor` checks the toolchain. If a patch was just changed, "
            "`buun patch --status` shows the series state")
    if not shutil.which("cmake"):
        raise NotReadyError("cmake is not installed", "apt-get install cmake ninja-build ccache")
    console.step(f"configuring {what}{', sm_' + p.arch if p.arch else ''}, UI: {p.ui}")
    run_logged(["cmake", "-S", src, "-B", bdir, *p.cmake_args], log, env=env, what="cmake configure", hint=hint)
    console.step(f"building {', '.join(p.targets)} with {p.jobs} job(s); log: {log}")
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console.err, transient=True) as bar:
        task = bar.add_task("compiling", total=None)
        step_re = re.compile(r"^\[(\d+)/(\d+)\]")

        def on_line(line: str) -> None:
            m = step_re.match(line)
            if m:
                bar.update(task, completed=int(m.group(1)), total=int(m.group(2)))

        run_logged(["cmake", "--build", bdir, "-j", str(p.jobs), "--target", *p.targets], log,
                   env=env, on_line=on_line, what="llama.cpp build", hint=hint)
    if _missing_binaries(p.name, p.targets):
        raise BuunError(f"the build finished but binaries are missing in {bdir / 'bin'}", f"see {log}")
    (bdir / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    seconds = time.monotonic() - t0
    console.ok(f"built {what} in {seconds:.0f} s: {bdir / 'bin'}")
    return BuildResult(p.name, bdir, True, seconds, stamp)


BIN_DIR_ENV = "BUUN_LLAMA_BIN_DIR"


def bin_dir_pinned() -> bool:
    """Whether BUUN_LLAMA_BIN_DIR names the binaries, whatever buun builds."""
    return bool(os.environ.get(BIN_DIR_ENV))


def bin_dir() -> Path:
    """The folder of the binaries every stage runs: BUUN_LLAMA_BIN_DIR, else the CUDA build,
    else the CPU build (whichever finished)."""
    if bin_dir_pinned():
        return Path(os.environ[BIN_DIR_ENV])
    for variant in VARIANTS:
        if read_stamp(variant) is not None:
            return paths.build_dir(variant) / "bin"
    raise NotReadyError("llama.cpp is not built yet", "run `buun build` (after `buun vendor` and `buun patch`)")


def upstream_bin_dir() -> Path:
    """The folder of the upstream build's binaries (the CUDA one, else the CPU one)."""
    for variant in VARIANTS:
        if read_stamp(f"{UPSTREAM}-{variant}") is not None:
            return paths.build_dir(f"{UPSTREAM}-{variant}") / "bin"
    raise NotReadyError("upstream llama.cpp is not built", "run `buun build --upstream` (with the flags of your "
                        "`buun build`: --cpu, --cuda-arch N)")


def find_upstream_binary(name: str) -> Path:
    """A program of the unpatched pin's build (`buun build --upstream`)."""
    path = upstream_bin_dir() / name
    if not path.is_file():
        raise NotReadyError(f"{name} is missing from {path.parent}", "run `buun build --upstream --force`")
    return path


def find_binary(name: str) -> Path:
    """The path of a llama.cpp program (llama-server, llama-quantize, ...)."""
    path = bin_dir() / name
    if not path.is_file():
        raise NotReadyError(f"{name} is missing from {path.parent}", "run `buun build --force`")
    return path
