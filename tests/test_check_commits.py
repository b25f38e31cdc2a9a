"""scripts/check_commits.py, CI's check of the commit-message convention (CONTRIBUTING.md), on a real
repository: only commits after the one that added the script are judged, and each kind of offence
fails the check with the commit named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_commits.py"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True, timeout=30)


def _commit(repo: Path, message: str, lines: int = 1) -> None:
    """A commit of `lines` added lines, in a file of its own."""
    name = f"f{len(list(repo.glob('f*.txt')))}.txt"
    (repo / name).write_text("".join(f"line {i}\n" for i in range(lines)))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


def _check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(repo / "scripts" / "check_commits.py")], cwd=repo,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose history before the script breaks every rule, then the script's commit."""
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "x" * 200, lines=50)  # history: never judged
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "check_commits.py")
    _commit(tmp_path, "Add the commit check\n\nIt judges what comes after it.")
    return tmp_path


def test_history_before_the_check_and_good_commits_pass(repo: Path) -> None:
    _commit(repo, "Fix a typo", lines=3)
    _commit(repo, "Split the journal by day\n\nThe journal grew by 600 lines a day.", lines=40)
    out = _check(repo)
    assert out.returncode == 0, out.stderr
    assert "2 commit(s)" in out.stdout


@pytest.mark.parametrize(("message", "lines", "problem"), [
    ("s" * 73, 1, "subject is 73 characters (at most 72)"),
    ("Rework the supervisor", 40, "changes 40 lines and has no body"),
    ("Subject\nbody glued to it", 1, "no blank line after the subject"),
])
def test_a_commit_that_breaks_the_convention_fails(repo: Path, message: str, lines: int, problem: str) -> None:
    _commit(repo, message, lines=lines)
    _commit(repo, "A good one after it")
    out = _check(repo)
    assert out.returncode == 1
    assert problem in out.stderr and "CONTRIBUTING.md" in out.stderr
    assert "A good one" not in out.stderr  # only the offender is named
