"""Two buun commands that change the same thing: the second waits for the first, says for what, and
then finds the work done. Real processes: real `buun` commands, or tests/support/lock_holder.py holding
the same lock as a stage would."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from buun_tool.base import paths
from buun_tool.base.errors import INTERRUPTED, Exit
from buun_tool.formats import layout, recipes
from buun_tool.pipeline import build, patches, vendor
from tests.support import waits
from tests.support.fake_hub import FakeHub
from tests.support.fake_llama_source import FakeProject, commit_change, hold_git_am, wait_for_file
from tests.support.lock_holder import buun, env, finish, release, stderr_until
from tests.support.tiny_checkpoints import write_recipe
from tests.test_pull import GGUF, TARGET
from tests.test_pull import hub as hub  # noqa: F401 (the fixture: small repos under the recipe's names)


def _series(p: FakeProject, n: int) -> list[str]:
    """A vendored tree and a series of `n` patches, none applied yet."""
    vendor.vendor()
    for i in range(n):
        commit_change(p.llama, "common/arg.cpp", f"int option_{i} = {i};", f"int option_{i} = {i}{i};",
                      f"arg: change {i}")
    names = patches.export()
    patches.reverse()
    return names


def test_two_patch_runs_one_after_the_other(fake_project: FakeProject, tmp_path: Path) -> None:
    # both ran `git am` in one tree: each aborted the other's, and both blamed a good patch (exit 8)
    names = _series(fake_project, 3)
    gate = tmp_path / "go"
    started = hold_git_am(fake_project.llama, gate)  # the first run waits after its first patch
    first = buun("patch")
    wait_for_file(started)
    second = buun("patch")
    seen = stderr_until(second, "...")
    assert f"waiting for `buun patch` (PID {first.pid}) to finish with the vendored tree {fake_project.llama}" \
        in seen, seen
    waits.until_blocked_in(second.pid, "flock", None, 30)  # it waits for the lock, as it said
    assert second.poll() is None  # still waiting while the first applies
    gate.touch()
    code, err = finish(first)
    assert code == 0 and "applied 3 of 3 patch(es)" in err and len(names) == 3, err
    code, err = finish(second, seen)
    assert code == 0 and "all 3 patch(es) already applied" in err, err
    assert [s.state for s in patches.status()] == ["applied"] * 3


def test_two_pulls_download_a_file_once(hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    # the second appended to the first's partial file, then to the file the first had verified and
    # renamed into place: a target GGUF of twice its size, and the second's exit 2 on a missing .part
    recipe_file = write_recipe(tmp_path / "tiny.yaml")
    stall = hub.stalls[(TARGET, GGUF)] = threading.Event()
    first = buun("pull", str(recipe_file))
    waits.until(lambda: hub.requests("GET", "resolve"), 30, "the first pull's first download")
    second = buun("pull", str(recipe_file))
    seen = stderr_until(second, "...")
    assert f"waiting for `buun pull` (PID {first.pid}) to finish with the models folder {paths.models_dir()}" \
        in seen, seen
    stall.set()
    assert finish(first)[0] == 0
    code, err = finish(second, seen)
    assert code == 0 and err.count("(up to date)") == 3, err
    target = layout.for_recipe(recipes.load_file(recipe_file), paths.models_dir()).target_gguf
    assert hashlib.sha256(target.read_bytes()).hexdigest() == hub.repos[TARGET].files[GGUF].sha256()
    assert len(hub.requests("GET", "resolve")) == 9  # each file once


def test_a_build_waits_for_its_folder_and_finds_it_built(llama_bin: Path, tmp_path: Path, holders,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a build folder of this test's, with the checkout's CPU build in it (its stamp, its binaries)
    builds, tree = tmp_path / "build", tmp_path / "vendor" / "llama.cpp"
    (builds / "cpu").mkdir(parents=True)
    shutil.copyfile(paths.build_dir("cpu") / build.STAMP, builds / "cpu" / build.STAMP)
    (builds / "cpu" / "bin").symlink_to(llama_bin)
    tree.parent.mkdir()
    tree.symlink_to(paths.llama_dir())
    monkeypatch.setenv("BUUN_BUILD_DIR", str(builds))
    monkeypatch.setenv("BUUN_LLAMA_DIR", str(tree))
    # another build reads the tree (shared: no wait for it) and builds in this folder
    holder = holders("vendor-shared", "build:cpu")
    proc = buun("build", "--cpu", "--json")
    seen = stderr_until(proc, "...")
    assert f"(PID {holder.pid}) to finish with the build folder {builds / 'cpu'}" in seen, seen
    release(holder)
    code, err = finish(proc, seen)
    assert code == 0 and "is up to date" in err, err


def test_a_patch_waits_for_a_build_and_ctrl_c_stops_the_wait(fake_project: FakeProject, holders) -> None:
    _series(fake_project, 1)
    holder = holders("vendor-shared")  # a build reading the tree
    proc = buun("patch")
    seen = stderr_until(proc, "...")
    assert f"(PID {holder.pid}) to finish with the vendored tree" in seen, seen
    # the line is printed before buun blocks on the lock: a SIGINT in between was noted, to act on
    # once the wait ended, which was never while the holder held on; so it is sent once buun waits
    waits.until_blocked_in(proc.pid, "flock", None, 30)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc, seen)
    assert code == Exit.INTERRUPTED and err.strip().splitlines()[-1] == INTERRUPTED and "Traceback" not in err
    assert holder.poll() is None  # the holder goes on
    assert [s.state for s in patches.status()] == ["pending"]


def test_a_killed_holder_leaves_no_lock_behind(fake_project: FakeProject, holders) -> None:
    holder = holders("vendor")
    proc = buun("vendor")
    seen = stderr_until(proc, "...")
    assert f"(PID {holder.pid}) to finish with the vendored tree" in seen, seen
    holder.send_signal(signal.SIGKILL)  # no cleanup of its own runs: the kernel lets go of the lock
    code, err = finish(proc, seen)
    assert code == 0 and vendor.state().at_pin, err
    again = buun("vendor")  # the lock file names a process that is gone: nothing to wait for
    code, err = finish(again)
    assert code == 0 and "waiting" not in err and "already at the pin" in err, err


def test_commands_that_only_read_never_wait(fake_project: FakeProject, holders, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _series(fake_project, 1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models = paths.models_dir()
    models.mkdir(parents=True)
    holders("vendor", "build:cpu", f"models:{models}")
    with monkeypatch.context() as m:
        m.delenv("BUUN_ROOT")  # the checkout's own recipe, made into the tiny pair's
        recipe_file = write_recipe(tmp_path / "tiny.yaml")
    for args in (["patch", "--status"], ["patch", "--check"], ["doctor", str(recipe_file), "--cpu"],
                 ["setup", "--recipe-file", str(recipe_file), "--cpu", "--dry-run"]):
        proc = subprocess.run([sys.executable, "-m", "buun_tool", *args], env=env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode in (0, Exit.FAILED) and "waiting" not in proc.stderr, (args, proc.stderr)
