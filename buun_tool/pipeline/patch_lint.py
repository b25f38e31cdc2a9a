"""`buun patch --lint`: no patch of the series rewrites or removes a line an earlier patch added.

A fix to patch N belongs in patch N (patches/README.md, "Working on a patch"). A later patch that
changes N's lines makes the series harder to review and to carry to a new pin: a rebase meets the
same lines twice. The check applies the series as commits on the baseline in a scratch worktree
and blames every line each patch removes on the tree before it: a line must come from the
baseline, not from a patch.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from buun_tool.base.errors import BuunError, Exit
from buun_tool.base.proc import git
from buun_tool.pipeline import patches, vendor

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.M)


@dataclass(frozen=True)
class Rewrite:
    patch: str  # the patch that removes the line
    path: str  # the file, as it was before that patch
    line: int  # the line's number there
    added_by: str  # the earlier patch that added it

    def __str__(self) -> str:
        return f"{self.patch} rewrites {self.path}:{self.line}, which {self.added_by} added"


def _removed(repo: Path, commit: str) -> dict[str, list[tuple[int, int]]]:
    """{file: [(first line, count)]} of the lines `commit` removes, numbered in its parent."""
    out: dict[str, list[tuple[int, int]]] = {}
    diff = git(repo, "diff", "-U0", "--no-renames", "--no-color", f"{commit}~1", commit)
    for part in diff.split("\ndiff --git "):
        m = re.search(r"^--- a/(.+)$", part, re.M)
        if m is None:
            continue  # a new file removes nothing
        for h in HUNK.finditer(part):
            start, count = int(h.group(1)), int(h.group(2) or 1)
            if count:
                out.setdefault(m.group(1), []).append((start, count))
    return out


def _blame(repo: Path, rev: str, path: str, start: int, count: int) -> list[str]:
    """The commit each line start..start+count-1 of `path` at `rev` comes from."""
    out = git(repo, "blame", "--porcelain", "-L", f"{start},+{count}", rev, "--", path)
    return [ln.split()[0] for ln in out.splitlines() if re.match(r"^[0-9a-f]{40} \d+ \d+", ln)]


def rewrites(repo: Path, base: str, names: dict[str, str]) -> list[Rewrite]:
    """Every line a commit of base..HEAD removes that a commit of base..HEAD added.
    `names` maps commit ids to the patch names to report."""
    found = []
    for commit in git(repo, "rev-list", "--reverse", f"{base}..HEAD").split():
        for path, hunks in _removed(repo, commit).items():
            for start, count in hunks:
                for i, origin in enumerate(_blame(repo, f"{commit}~1", path, start, count)):
                    if origin in names:
                        found.append(Rewrite(names.get(commit, commit[:10]), path, start + i, names[origin]))
    return found


def lint() -> list[Rewrite]:
    """Apply the series to the pin in a scratch worktree (the vendored tree is not touched) and
    return its rewrites; empty when every patch removes only upstream's lines."""
    repo = vendor.require_vendored()
    scratch = Path(tempfile.mkdtemp(prefix="buun-patch-lint-"))
    wt = scratch / "tree"
    git(repo, "worktree", "add", "-q", "--detach", str(wt), vendor.BASELINE_TAG)
    try:
        names = {}
        for p in patches.series():
            if not patches.am(wt, p):
                raise BuunError(f"patch {p.name} does not apply to the pin",
                                "`buun patch --check` names the file and the hunk", exit_code=Exit.CONFLICT)
            names[git(wt, "rev-parse", "HEAD").strip()] = p.name
        return rewrites(wt, vendor.BASELINE_TAG, names)
    finally:
        git(repo, "worktree", "remove", "--force", str(wt), check=False)
        git(repo, "worktree", "prune", check=False)
        shutil.rmtree(scratch, ignore_errors=True)
