"""`buun patch`: apply, dry run, status, reverse and export of a patch series, on a real git tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.base.errors import BuunError, Exit
from buun_tool.cli.app import app
from buun_tool.pipeline import patches, vendor
from tests.support.fake_llama_source import FakeProject, commit_change, hold_git_am, run, wait_for_file
from tests.support.lock_holder import env

runner = CliRunner()


def head(p: FakeProject) -> str:
    return run("git", "-C", str(p.llama), "rev-parse", "HEAD")


@pytest.fixture
def series(fake_project: FakeProject) -> FakeProject:
    """A vendored tree and a two-patch series written through the developer workflow."""
    vendor.vendor()
    commit_change(fake_project.llama, "common/arg.cpp", "int option_3 = 3;", "int option_3 = 33;",
                  "arg: first change\n\nWhy: a test.")
    commit_change(fake_project.llama, "common/speculative.cpp", "// line 20", "// line twenty",
                  "spec: second change")
    assert patches.export() == ["0001-arg-first-change.patch", "0002-spec-second-change.patch"]
    return fake_project


def test_export_writes_numbered_patches_with_their_header(series: FakeProject) -> None:
    first = (series.patches / "0001-arg-first-change.patch").read_text()
    assert "Subject: [PATCH] arg: first change" in first and "Why: a test." in first
    assert first.startswith("From 0000000000000000000000000000000000000000")  # no machine-specific ids
    before = {p.name: p.read_bytes() for p in series.patches.iterdir()}
    patches.export()
    assert {p.name: p.read_bytes() for p in series.patches.iterdir()} == before


def test_reverse_apply_idempotent(series: FakeProject) -> None:
    assert [s.state for s in patches.status()] == ["applied", "applied"]
    assert patches.reverse() == 2
    assert head(series) == run("git", "-C", str(series.llama), "rev-parse", "buun-baseline")
    assert [s.state for s in patches.status()] == ["pending", "pending"]
    assert patches.apply() == ["0001-arg-first-change.patch", "0002-spec-second-change.patch"]
    assert "option_3 = 33" in (series.llama / "common/arg.cpp").read_text()
    assert patches.apply() == []  # nothing left to do
    first = head(series)
    patches.reverse()
    patches.apply()
    assert head(series) == first  # same series -> same commits, whatever the machine


def test_check_is_a_dry_run(series: FakeProject) -> None:
    patches.reverse()
    before = head(series)
    assert patches.check() == ["0001-arg-first-change.patch", "0002-spec-second-change.patch"]
    assert head(series) == before
    assert run("git", "-C", str(series.llama), "worktree", "list").count("\n") == 0  # scratch worktree gone


def test_failing_patch_leaves_the_tree_unchanged(series: FakeProject) -> None:
    patches.reverse()
    second = series.patches / "0002-spec-second-change.patch"
    second.write_text(second.read_text().replace("-// line 20", "-// line 2000"))  # no longer matches
    before = head(series)
    with pytest.raises(BuunError) as exc:
        patches.apply()
    msg = str(exc.value)
    assert "0002-spec-second-change.patch" in msg and "common/speculative.cpp" in msg
    assert "regenerate" in (exc.value.hint or "") and exc.value.exit_code == Exit.CONFLICT
    assert head(series) == before  # 0001 was rolled back too
    assert run("git", "-C", str(series.llama), "status", "--porcelain") == ""


def test_changed_patch_replaces_the_stale_commit(series: FakeProject) -> None:
    first = series.patches / "0001-arg-first-change.patch"
    first.write_text(first.read_text().replace("+int option_3 = 33;", "+int option_3 = 333;"))
    assert [s.state for s in patches.status()] == ["stale", "applied"]
    patches.apply()
    assert [s.state for s in patches.status()] == ["applied", "applied"]
    assert "option_3 = 333" in (series.llama / "common/arg.cpp").read_text()


def test_unexported_work_is_never_dropped(series: FakeProject) -> None:
    commit_change(series.llama, "common/arg.cpp", "int option_5 = 5;", "int option_5 = 55;", "my experiment")
    with pytest.raises(BuunError, match="my experiment"):
        patches.reverse()
    first = series.patches / "0001-arg-first-change.patch"
    first.write_text(first.read_text().replace("+int option_3 = 33;", "+int option_3 = 333;"))
    with pytest.raises(BuunError, match="export them first"):
        patches.apply()
    assert "option_5 = 55" in (series.llama / "common/arg.cpp").read_text()


def test_uncommitted_edits_block_apply(series: FakeProject) -> None:
    (series.llama / "common/arg.cpp").write_text("edited\n")
    result = runner.invoke(app, ["patch"])
    assert result.exit_code == Exit.CONFLICT
    assert "uncommitted changes" in result.output


def test_cli_status_and_apply(series: FakeProject) -> None:
    assert runner.invoke(app, ["patch", "--reverse"]).exit_code == 0
    result = runner.invoke(app, ["patch", "--status"])
    assert result.exit_code == 0 and result.output.count("pending") == 2
    result = runner.invoke(app, ["patch"])
    assert result.exit_code == 0 and "applied 2 of 2 patch(es) (`buun patch --status` lists them)" in result.output
    assert ".patch" not in result.output  # the names only with --verbose: buun's 48 made a line of ~3.5 KB
    assert runner.invoke(app, ["patch", "--reverse"]).exit_code == 0
    result = runner.invoke(app, ["patch", "--check"])
    assert result.exit_code == 0 and "2 patch(es) would apply cleanly (" in result.output, result.output
    result = runner.invoke(app, ["patch", "--verbose"])
    names = [p.name for p in patches.series()]
    assert result.exit_code == 0 and f"applied 2 of 2 patch(es): {', '.join(names)}" in " ".join(result.output.split())
    assert runner.invoke(app, ["patch", "--check", "--status"]).exit_code == Exit.USAGE


def test_doctor_sums_the_series_up_in_one_line(series: FakeProject) -> None:
    """Doctor listed every patch's number and state (`0001:applied, 0002:applied, ...`: 48 of them for
    buun's series); it gives the count, and the numbers of those not applied by state."""
    from buun_tool.pipeline import doctor

    def line() -> str:
        return next(c.detail for c in doctor.check_llama_state() if c.name == "patches")

    assert line() == "all 2 applied"
    patches.reverse()
    assert line() == "0 of 2 applied; pending: 0001, 0002"
    run("git", "-C", str(series.llama), "am", "-q", str(series.patches / "0001-arg-first-change.patch"))
    assert line() == "1 of 2 applied; pending: 0002"


def test_a_run_stopped_mid_git_am_is_resumed(series: FakeProject, tmp_path: Path) -> None:
    """Ctrl-C (to the terminal's whole process group: git too) while `git am` applied a patch left
    that `git am` in progress: the next `buun patch` blamed a good patch (exit 8, "regenerate it")."""
    patches.reverse()
    gate = tmp_path / "go"
    started = hold_git_am(series.llama, gate)  # the first patch waits there
    cmd = [sys.executable, "-m", "buun_tool", "patch"]
    stopped = subprocess.Popen(cmd, env=env(), start_new_session=True, text=True, stderr=subprocess.PIPE)
    wait_for_file(started)
    os.killpg(stopped.pid, signal.SIGINT)
    assert stopped.wait(30) == Exit.INTERRUPTED
    assert (series.llama / ".git" / "rebase-apply").is_dir()
    gate.touch()
    again = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "of 2 patch(es)" in again.stderr, again.stderr
    assert [s.state for s in patches.status()] == ["applied", "applied"]
    assert not (series.llama / ".git" / "rebase-apply").exists()


def test_a_git_am_of_the_users_own_is_left_alone(series: FakeProject, tmp_path: Path) -> None:
    patches.reverse()
    mine = tmp_path / "mine.patch"  # a patch being regenerated by hand: its `git am` stopped
    mine.write_text((series.patches / "0002-spec-second-change.patch").read_text().replace("-// line 20",
                                                                                          "-// line 2000"))
    assert subprocess.run(["git", "-C", str(series.llama), "am", str(mine)], capture_output=True).returncode != 0
    result = runner.invoke(app, ["patch"])
    assert result.exit_code == Exit.CONFLICT and "`git am` in progress that buun did not start" in result.output
    assert (series.llama / ".git" / "rebase-apply").is_dir()  # still theirs to continue or abort
    assert [s.state for s in patches.status()] == ["pending", "pending"]
