"""Stage: apply buun's patch series (patches/NNNN-*.patch) to vendor/llama.cpp.

The patches are `git format-patch` files; each is applied with `git am` as one commit on top of
the baseline, so the vendored tree's history *is* the series and `export` writes it back out.

- Idempotent: a patch whose patch-id matches a commit above the baseline is applied; skipped.
- Atomic: if patch N fails, HEAD is reset to where the run started; nothing half-applied stays.
  A run stopped mid-`git am` (Ctrl-C, SIGKILL) leaves that patch's `git am` to the next, which
  ends it and applies the rest.
- Stale: after patches/ changed (git pull, pin bump), commits that carry a series patch's
  subject but other content are replaced by re-applying the series from the baseline.
- Safe: commits that are not series patches are someone's work; buun refuses to drop them and
  says to export first.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from buun_tool.base import locks, paths
from buun_tool.base.errors import BuunError, Exit, NotReadyError, UsageError
from buun_tool.base.proc import git, run
from buun_tool.pipeline import patch_docs, vendor
from buun_tool.pipeline.stage import StageStatus, current, stale

PATCH_RE = re.compile(r"^\d{4}-.+\.patch$")
COMMITTER = {"GIT_COMMITTER_NAME": "buun", "GIT_COMMITTER_EMAIL": "buun@localhost"}
# In the vendored repo's .git while `buun patch` applies the series; still there (beside git's
# rebase-apply/) when a run was stopped mid-`git am` (Ctrl-C, SIGKILL), which nothing ended.
APPLYING = "buun-applying"

# The series' switch for the delta-net rollback (patch 0011), read by the patched llama.cpp from
# its environment: the tape replay (its default) or upstream's snapshot planes.
ROLLBACK_ENV = "LLAMA_RS_ROLLBACK"
ROLLBACKS = ("tape", "snapshot")
# The series' environment switches, each for a user or a maintainer (patches/README.md says why):
# the rollback (tape or upstream's snapshots), the small-batch matmul off (0 or a list of types),
# the device-resident features off (0: through the host), greedy requests through upstream's
# sampler chain (0), row-wise sampler chains once per row (0), and the step profile (1).
SWITCHES = (ROLLBACK_ENV, "GGML_CUDA_MMQ_SMALL", "LLAMA_DFLASH_DEVICE_FEATURES", "LLAMA_SAMPLING_GREEDY",
            "LLAMA_SAMPLER_ROWS", "LLAMA_SPEC_PROFILE")


def rollback_from_env() -> str:
    """The rollback a patched llama-server started from this environment uses. Any other value
    would leave it on the tape without a word, so it is an error here."""
    value = os.environ.get(ROLLBACK_ENV) or "tape"
    if value not in ROLLBACKS:
        raise UsageError(f"{ROLLBACK_ENV}={value}: expected {' or '.join(ROLLBACKS)}",
                         f"unset it for the tape replay (the default), or set {ROLLBACK_ENV}=snapshot")
    return value


@dataclass(frozen=True)
class Patch:
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    @property
    def subject(self) -> str:
        return patch_docs.subject(self.path)


@dataclass
class PatchStatus:
    patch: Patch
    state: str  # applied | pending | stale | conflict
    detail: str = ""


def series(directory: Path | None = None) -> list[Patch]:
    d = directory or paths.patches_dir()
    return [Patch(p) for p in sorted(d.glob("*.patch")) if PATCH_RE.match(p.name)]


def fingerprint() -> list[dict[str, str]]:
    """Names and hashes of the series, for stamps and provenance records."""
    return [{"name": p.name, "sha256": p.sha256} for p in series()]


def _patch_id(diff: bytes) -> str | None:
    out = subprocess.run(["git", "patch-id", "--stable"], input=diff, capture_output=True).stdout.decode()
    return out.split()[0] if out.strip() else None


def _commits(repo: Path) -> list[tuple[str, str, str | None]]:
    """(sha, subject, patch-id) of each commit above the baseline, oldest first."""
    shas = git(repo, "rev-list", "--reverse", f"{vendor.BASELINE_TAG}..HEAD").split()
    result = []
    for sha in shas:
        subject = git(repo, "log", "-1", "--format=%s", sha)
        diff = subprocess.run(["git", "-C", str(repo), "show", "--format=", sha], capture_output=True).stdout
        result.append((sha, subject, _patch_id(diff)))
    return result


def _require_clean(repo: Path) -> None:
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    if dirty:
        raise BuunError(
            f"vendor/llama.cpp has uncommitted changes:\n{dirty}",
            "commit them (then `buun patch export`) or discard them (`git -C vendor/llama.cpp checkout .`)",
            exit_code=Exit.CONFLICT,
        )


def _failure_detail(repo: Path, patch: Patch) -> str:
    """Which file and hunk of `patch` do not apply to the tree as it is now."""
    check = run(["git", "-C", str(repo), "apply", "--check", "-v", str(patch.path)], check=False)
    lines = [ln for ln in (check.stderr + check.stdout).splitlines()
             if ln.startswith(("error:", "Checking patch")) or "hunk" in ln.lower()]
    failing = [ln for ln in lines if ln.startswith("error:")]
    return "\n".join(failing or lines[-6:]) or check.stderr.strip()


def status() -> list[PatchStatus]:
    repo = vendor.require_vendored()
    commits = _commits(repo)
    ids = {pid for _, _, pid in commits if pid}
    subjects = {subj for _, subj, _ in commits}
    result = []
    for p in series():
        if _patch_id(p.path.read_bytes()) in ids:
            result.append(PatchStatus(p, "applied"))
        elif p.subject in subjects:
            result.append(PatchStatus(p, "stale", "an older version is applied; `buun patch` replaces it"))
        else:
            result.append(PatchStatus(p, "pending"))
    return result


def stage_status() -> StageStatus:
    """The patch stage's own answer: current when the vendored tree carries the whole series as
    patches/ has it now."""
    try:
        states = status()
    except BuunError as exc:  # no tree at the pin to patch yet
        return stale(exc.message)
    missing = [s for s in states if s.state != "applied"]
    if missing:
        return stale(", ".join(f"{s.patch.name}: {s.state}" for s in missing))
    return current(f"all {len(states)} patch(es) applied")


def require_applied() -> None:
    """For the build: the vendored tree carries the whole series as patches/ has it now; else the
    binaries would be upstream's or half-patched, with nothing to say so."""
    missing = [s for s in status() if s.state != "applied"]
    if missing:
        raise NotReadyError(
            "vendor/llama.cpp does not carry the whole patch series, so the build would not be buun's "
            "llama.cpp:\n  " + "\n  ".join(f"{s.patch.name}: {s.state}" for s in missing),
            "run `buun patch` (it applies pending patches and replaces stale ones), then build again",
        )


def _unknown_commits(repo: Path, patches: list[Patch]) -> list[str]:
    ids = {_patch_id(p.path.read_bytes()) for p in patches}
    subjects = {p.subject for p in patches}
    return [f"{sha[:10]} {subj}" for sha, subj, pid in _commits(repo) if pid not in ids and subj not in subjects]


def am(repo: Path, patch: Patch) -> bool:
    # The author and date come from the patch; a fixed committer makes the commit ids depend on
    # the series alone (and works on machines with no git identity configured).
    proc = run(["git", "-C", str(repo), "am", "--keep-cr", "--whitespace=nowarn", "--committer-date-is-author-date",
                str(patch.path)], check=False, env=COMMITTER)
    if proc.returncode != 0:
        run(["git", "-C", str(repo), "am", "--abort"], check=False)
        return False
    return True


def _apply_series(repo: Path, start: str) -> list[str]:
    """Apply every series patch not yet in HEAD; on failure reset to `start` and raise."""
    done = []
    for st in status():
        if st.state == "applied":
            continue
        if not am(repo, st.patch):
            detail = _failure_detail(repo, st.patch)
            git(repo, "reset", "-q", "--hard", start)
            pin = vendor.load_pin()
            raise BuunError(
                f"patch {st.patch.name} does not apply to llama.cpp {pin.short}:\n{detail}\n"
                "vendor/llama.cpp is unchanged.",
                "regenerate it against the pin: in vendor/llama.cpp apply the patches before it, make the "
                "change by hand, `git commit`, then `buun patch export` (see patches/README.md)",
                exit_code=Exit.CONFLICT,
            )
        done.append(st.patch.name)
    return done


def apply() -> list[str]:
    """Apply the series; return the names of the patches applied now (empty: nothing to do)."""
    with locks.vendor_tree():  # two `git am` in one tree abort each other's
        return _apply()


def _apply() -> list[str]:
    repo = vendor.require_vendored()
    _end_stopped_apply(repo)
    _require_clean(repo)
    start = git(repo, "rev-parse", "HEAD")
    states = status()
    if any(s.state == "stale" for s in states):
        unknown = _unknown_commits(repo, series())
        if unknown:
            raise BuunError(
                "patches/ changed, but vendor/llama.cpp also holds commits that are not series patches:\n  "
                + "\n  ".join(unknown),
                "export them first (`buun patch export`) or drop them, then run `buun patch` again",
                exit_code=Exit.CONFLICT,
            )
        git(repo, "reset", "-q", "--hard", vendor.BASELINE_TAG)
    mark = repo / ".git" / APPLYING
    mark.touch()
    try:
        applied = _apply_series(repo, start)
    except Exception:  # a patch that fails is reset and its `git am` ended; a Ctrl-C's is left to the next run
        mark.unlink()
        raise
    mark.unlink()
    return applied


def _end_stopped_apply(repo: Path) -> None:
    """End the `git am` that a stopped `buun patch` left in progress (the vendored tree's lock says
    no other runs now): left, the next `git am` failed and the run blamed a good patch (exit 8).
    HEAD goes back to before the patch it was applying; the patches before it stay, and this run
    applies the rest. A `git am` that buun did not start is the user's: named, never ended."""
    git_dir = repo / ".git"
    if (git_dir / "rebase-apply").is_dir():
        if not (git_dir / APPLYING).exists():
            raise BuunError("vendor/llama.cpp has a `git am` in progress that buun did not start",
                            "finish it (`git am --continue` in vendor/llama.cpp) or end it (`git am --abort`), "
                            "then run `buun patch` again", exit_code=Exit.CONFLICT)
        git(repo, "am", "--abort")
    (git_dir / APPLYING).unlink(missing_ok=True)


def describe_applied(applied: list[str], verbose: bool = False) -> str:
    """The result line of an apply (`buun patch`, the patch stage of `buun setup`): the count, and
    the names with `verbose` (the whole series is one line of kilobytes)."""
    total = len(series())
    if applied:
        return f"applied {len(applied)} of {total} patch(es)" + names_of(applied, verbose)
    return f"all {total} patch(es) already applied"


def names_of(names: list[str], verbose: bool) -> str:
    """`: NAME, NAME, ...` for a line that counts patches, with `verbose`; else where they are listed."""
    return f": {', '.join(names)}" if verbose else " (`buun patch --status` lists them)"


def check() -> list[str]:
    """Dry run: apply the pending patches in a scratch worktree; the vendored tree is not touched."""
    repo = vendor.require_vendored()
    scratch = Path(tempfile.mkdtemp(prefix="buun-patch-check-"))
    wt = scratch / "tree"
    git(repo, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
    try:
        pending = [s.patch for s in status() if s.state != "applied"]
        if any(s.state == "stale" for s in status()):
            git(wt, "reset", "-q", "--hard", vendor.BASELINE_TAG)
            pending = series()
        for p in pending:
            if not am(wt, p):
                raise BuunError(f"patch {p.name} would not apply:\n{_failure_detail(wt, p)}",
                                "regenerate it against the pin (see patches/README.md)", exit_code=Exit.CONFLICT)
        return [p.name for p in pending]
    finally:
        git(repo, "worktree", "remove", "--force", str(wt), check=False)
        git(repo, "worktree", "prune", check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def reverse() -> int:
    """Remove the series: back to the pristine baseline. Refuses to drop commits of other work."""
    with locks.vendor_tree():
        return _reverse()


def _reverse() -> int:
    repo = vendor.require_vendored()
    _require_clean(repo)
    unknown = _unknown_commits(repo, series())
    if unknown:
        raise BuunError("vendor/llama.cpp holds commits that are not series patches:\n  " + "\n  ".join(unknown),
                        "export them first (`buun patch export`)", exit_code=Exit.CONFLICT)
    n = len(_commits(repo))
    git(repo, "reset", "-q", "--hard", vendor.BASELINE_TAG)
    return n


def export() -> list[str]:
    """Regenerate patches/ from the commits above the baseline in vendor/llama.cpp."""
    with locks.vendor_tree():  # the series as it is, not half of one a `buun patch` is applying
        return _export()


def _export() -> list[str]:
    repo = vendor.require_vendored()
    _require_clean(repo)
    out = paths.patches_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Stable output whatever the machine: fixed hash length, no commit ids or git version.
        git(repo, "-c", "core.abbrev=12", "-c", "diff.noprefix=false", "format-patch", "--zero-commit",
            "--no-signature", "--no-stat", "-N", "-o", tmp, f"{vendor.BASELINE_TAG}..HEAD")
        new = sorted(Path(tmp).glob("*.patch"))
        for old in series(out):
            old.path.unlink()
        for f in new:
            shutil.move(str(f), out / f.name)
    readme = out / "README.md"
    if readme.is_file():  # the series' description, from the headers just written
        patch_docs.rewrite(readme, [p.path for p in series(out)])
    return [f.name for f in new]
