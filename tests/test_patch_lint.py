"""`buun patch --lint`: no patch of the series rewrites or removes a line an earlier patch added
(a fix to patch N goes into patch N). The rule on a small repository of its own, then on the real
series against the pin."""

from __future__ import annotations

import subprocess
from pathlib import Path

from typer.testing import CliRunner

from buun_tool.base.errors import Exit
from buun_tool.cli.app import app
from buun_tool.pipeline import patch_lint, patches, vendor
from tests.support.fake_llama_source import FakeProject, commit_change

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
       "PATH": "/usr/bin:/bin"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=ENV).stdout


def _commit(repo: Path, text: str, msg: str) -> str:
    (repo / "f.c").write_text(text)
    _git(repo, "add", "f.c")
    _git(repo, "commit", "-q", "-m", msg)
    return _git(repo, "rev-parse", "HEAD").strip()


def _series(tmp_path: Path, second: str) -> tuple[Path, str, dict[str, str]]:
    """A baseline of four lines, patch 1 adding two, patch 2 making the file `second`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    base = _commit(repo, "a\nb\nc\nd\n", "baseline")
    one = _commit(repo, "a\nb\nadded 1\nadded 2\nc\nd\n", "patch 1")
    two = _commit(repo, second, "patch 2")
    return repo, base, {one: "0001", two: "0002"}


def test_a_patch_that_changes_only_upstreams_lines_passes(tmp_path: Path) -> None:
    repo, base, names = _series(tmp_path, "a\nB\nadded 1\nadded 2\nc\n")  # b changed, d removed
    assert patch_lint.rewrites(repo, base, names) == []


def test_a_patch_that_rewrites_an_earlier_patchs_line_is_named(tmp_path: Path) -> None:
    repo, base, names = _series(tmp_path, "a\nb\nadded 1\nfixed 2\nc\nd\n")
    found = patch_lint.rewrites(repo, base, names)
    assert [str(r) for r in found] == ["0002 rewrites f.c:4, which 0001 added"]


def test_a_patch_that_removes_an_earlier_patchs_lines_is_named(tmp_path: Path) -> None:
    repo, base, names = _series(tmp_path, "a\nb\nc\nd\n")
    found = patch_lint.rewrites(repo, base, names)
    assert [(r.patch, r.line, r.added_by) for r in found] == [("0002", 3, "0001"), ("0002", 4, "0001")]


def test_the_series_rewrites_no_line_of_its_own(llama_bin: Path) -> None:
    """The real series, applied to the pin in a scratch worktree (the build fixture: the tree is
    vendored and patched wherever the suite's build exists)."""
    result = CliRunner().invoke(app, ["patch", "--lint"])
    assert result.exit_code == 0, result.output
    assert "no patch of the" in result.output


def test_the_command_names_a_rewrite_and_exits_with_a_conflict(fake_project: FakeProject) -> None:
    """`buun patch --lint` on a vendored tree whose series rewrites its own line: exit 8 (a
    conflict), the line and both patches named, and the vendored tree as it was."""
    vendor.vendor()
    commit_change(fake_project.llama, "common/arg.cpp", "int option_3 = 3;", "int option_3 = 33;", "arg: a change")
    commit_change(fake_project.llama, "common/arg.cpp", "int option_3 = 33;", "int option_3 = 34;", "arg: a fix-up")
    patches.export()
    before = _git(fake_project.llama, "rev-parse", "HEAD")
    result = CliRunner().invoke(app, ["patch", "--lint"])
    assert result.exit_code == Exit.CONFLICT, result.output
    assert "0002-arg-a-fix-up.patch rewrites common/arg.cpp:" in result.output
    assert "which 0001-arg-a-change.patch added" in result.output
    assert _git(fake_project.llama, "rev-parse", "HEAD") == before
