#!/usr/bin/env python3
"""Checks the commit-message convention of CONTRIBUTING.md on every commit after the one that added
this script: a subject of at most 72 characters, and a body (after a blank line) on any commit that
changes more than a few lines. Commits before it are history and are not judged.

    python3 scripts/check_commits.py [REV]     # REV defaults to HEAD; exit 1 names each offender
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72
FEW_LINES = 10  # a change of more lines than this (added + removed) needs a body that says why
SELF = "scripts/check_commits.py"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent).stdout


def first_commit() -> str | None:
    """The commit that added this script, or None in a clone too shallow to hold it."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", SELF).split()
    return added[-1] if added else None


def changed_lines(rev: str) -> int:
    total = 0
    for line in git("show", "--numstat", "--format=", rev).splitlines():
        added, removed, _ = line.split("\t", 2)
        total += int(added) + int(removed) if added != "-" else 1  # a binary file counts as one line
    return total


def problems(rev: str) -> list[str]:
    message = git("log", "-1", "--format=%B", rev).rstrip("\n")
    subject, _, rest = message.partition("\n")
    out = []
    if len(subject) > MAX_SUBJECT:
        out.append(f"subject is {len(subject)} characters (at most {MAX_SUBJECT})")
    if rest and not rest.startswith("\n"):
        out.append("no blank line after the subject")
    if not rest.strip() and (n := changed_lines(rev)) > FEW_LINES:
        out.append(f"changes {n} lines and has no body: say why, with the figures if any")
    return out


def main(argv: list[str]) -> int:
    head = argv[1] if len(argv) > 1 else "HEAD"
    start = first_commit()
    if start is None:
        revs = [git("rev-parse", head).strip()]  # shallow clone: judge the tip alone
    else:
        revs = git("rev-list", "--no-merges", f"{start}..{head}").split()
    bad = 0
    for rev in reversed(revs):
        for problem in problems(rev):
            bad += 1
            subject = git("log", "-1", "--format=%s", rev).strip()
            print(f"{rev[:10]} {subject[:60]!r}: {problem}", file=sys.stderr)
    if bad:
        print(f"check_commits: {bad} problem(s); the convention is in CONTRIBUTING.md. Before they land, "
              "`git rebase -i` can reword them.", file=sys.stderr)
        return 1
    since = start[:10] if start else "the shallow tip"
    print(f"check_commits: {len(revs)} commit(s) after {since} follow the convention")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
