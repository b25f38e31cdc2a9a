"""`buun build`: the plan (flags, arch, UI), the no-op rebuild and the binary lookup, against the
real CPU build of this checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from buun_tool.base import nvidia, paths
from buun_tool.base.errors import Exit, NotReadyError, UsageError
from buun_tool.cli.app import app
from buun_tool.pipeline import build, patches, vendor
from tests.support.fake_llama_source import FakeProject, commit_change, run
from tests.support.lock_holder import env, release, stderr_until

runner = CliRunner()


def test_unchanged_rebuild_is_a_noop(llama_bin: Path) -> None:
    log = paths.build_dir("cpu") / "build.log"
    before = log.stat().st_mtime_ns
    result = runner.invoke(app, ["build", "--cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert '"rebuilt": false' in result.stdout
    assert log.stat().st_mtime_ns == before  # cmake and ninja did not even run


def test_binaries_are_found_and_run(llama_bin: Path) -> None:
    server = build.find_binary("llama-server")
    out = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "version" in (out.stdout + out.stderr)
    for name in build.TARGETS:
        assert build.find_binary(name).is_file()
    with pytest.raises(NotReadyError, match="run `buun build --force`"):
        build.find_binary("llama-not-a-program")


def test_the_targets_that_allow_it_compile_as_unity_builds(llama_bin: Path) -> None:
    """buun_tool/data/unity.cmake took effect: its targets compiled as batches of sources (CMake's
    Unity folders), without the sources it leaves out."""
    bdir = paths.build_dir("cpu")

    def batched(target: str) -> str:
        files = list(bdir.glob(f"**/{target}.dir/Unity/unity_*_cxx.cxx"))
        assert files, f"{target} did not compile as a unity build in {bdir}"
        return "".join(f.read_text() for f in files)

    assert "/server-context.cpp" in batched("server-context")
    common = batched("llama-common")
    assert "/common/arg.cpp" in common and "/common/json.cpp" not in common
    mtmd = batched("mtmd")
    assert "/mtmd/clip.cpp" in mtmd and "/mtmd-helper.cpp" not in mtmd


def test_cuda_plan_has_the_forks_flags_and_the_given_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    p = build.plan(cuda=True, arch="86", ui="none")
    assert p.variant == "cuda" and p.arch == "86"
    for flag in build.CUDA_FLAGS:
        assert flag in p.cmake_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=86" in p.cmake_args
    assert "-DLLAMA_BUILD_UI=OFF" in p.cmake_args and "-DLLAMA_USE_PREBUILT_UI=OFF" in p.cmake_args


def test_cuda_arch_comes_from_the_gpu_never_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(nvidia, "detect_gpus", lambda: [nvidia.Gpu("NVIDIA GeForce RTX 3090", "8.6", 24576, "580")])
    assert "-DCMAKE_CUDA_ARCHITECTURES=86" in build.plan(ui="none").cmake_args  # picked without --cuda
    monkeypatch.setattr(nvidia, "detect_gpus", lambda: [])
    with pytest.raises(UsageError, match="--cuda-arch"):
        build.plan(cuda=True, ui="none")


def test_cpu_plan_and_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvidia, "detect_gpus", lambda: [])
    p = build.plan(ui="build")
    assert p.variant == "cpu" and "-DGGML_CUDA=OFF" in p.cmake_args and "-DLLAMA_BUILD_UI=ON" in p.cmake_args
    assert not any("CUDA_ARCHITECTURES" in a for a in p.cmake_args)
    with pytest.raises(UsageError):
        build.plan(cpu=True, cuda=True)
    with pytest.raises(UsageError):
        build.plan(cpu=True, ui="sometimes")


def _two_patch_series(p: FakeProject) -> list[str]:
    vendor.vendor()
    commit_change(p.llama, "common/arg.cpp", "int option_3 = 3;", "int option_3 = 33;", "arg: first change")
    commit_change(p.llama, "common/speculative.cpp", "// line 20", "// line twenty", "spec: second change")
    return patches.export()


@pytest.mark.parametrize("tree", ["pending", "partly applied", "stale"])
def test_build_refuses_a_tree_without_the_whole_series(fake_project: FakeProject, tree: str) -> None:
    first, second = _two_patch_series(fake_project)
    if tree == "pending":
        patches.reverse()
        want = [f"{first}: pending", f"{second}: pending"]
    elif tree == "partly applied":
        run("git", "-C", str(fake_project.llama), "reset", "-q", "--hard", "HEAD~1")
        want = [f"{second}: pending"]
    else:  # patches/ changed after the series was applied (a git pull, say)
        f = fake_project.patches / first
        f.write_text(f.read_text().replace("+int option_3 = 33;", "+int option_3 = 333;"))
        want = [f"{first}: stale"]
    result = runner.invoke(app, ["build", "--cpu", "--ui", "none"])
    assert result.exit_code == Exit.NOT_READY, result.output
    assert "does not carry the whole patch series" in result.output and "run `buun patch`" in result.output
    for line in want:
        assert line in result.output
    assert not paths.build_dir("cpu").exists()  # refused before cmake configured anything
    patches.apply()
    patches.require_applied()  # the whole series: the build may go on


def test_a_full_disk_is_a_clean_error_whatever_write_meets_it(fake_project: FakeProject) -> None:
    vendor.vendor()  # an empty series: nothing to apply
    log = paths.build_dir("cpu") / "build.log"
    log.parent.mkdir(parents=True)
    log.symlink_to("/dev/full")  # every write to the build log answers ENOSPC, as on a full disk
    result = runner.invoke(app, ["build", "--cpu", "--ui", "none"])
    assert result.exit_code == Exit.DISK, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    assert "the disk is full" in result.output and "free some space" in result.output


def test_upstream_is_the_same_build_of_the_pin_unpatched(fake_project: FakeProject) -> None:
    """`buun build --upstream`: the plan's flags with its own folder and stamp, from an export of the
    tag buun-baseline under the build folder; the patched tree and its repository are only read."""
    _two_patch_series(fake_project)
    p = build.plan(cpu=True, ui="none")
    up = p.for_upstream()
    assert (up.name, up.build_dir) == ("upstream-cpu", paths.build_dir("upstream-cpu"))
    assert up.targets == build.UPSTREAM_TARGETS
    assert up.cmake_args == p.cmake_args and up.jobs == p.jobs and p.name == "cpu"
    head = run("git", "-C", str(fake_project.llama), "rev-parse", "HEAD")
    src = build.upstream_source()
    assert src.parent == paths.build_dir("cpu").parent
    assert "int option_3 = 3;" in (src / "common/arg.cpp").read_text()  # the pin, without the series
    assert "int option_3 = 33;" in (fake_project.llama / "common/arg.cpp").read_text()
    assert run("git", "-C", str(fake_project.llama), "rev-parse", "HEAD") == head
    assert run("git", "-C", str(fake_project.llama), "status", "--porcelain") == ""
    (src / "common/arg.cpp").write_text("left as it is: the tag has not moved\n")
    assert build.upstream_source() == src and "left as it is" in (src / "common/arg.cpp").read_text()
    stamp = build._stamp_for(up, src)
    assert stamp["upstream"] is True and stamp["source"]["commits"] == []
    assert stamp["source"]["tree"] != build._stamp_for(p, fake_project.llama)["source"]["tree"]
    with pytest.raises(NotReadyError, match="buun build --upstream"):
        build.find_upstream_binary("llama-server")


def test_two_upstream_builds_export_the_pin_one_after_the_other(fake_project: FakeProject, holders) -> None:
    """The upstream builds of two variants (upstream-cpu, upstream-cuda: each its own build folder's
    lock) share one export, upstream-src: two first ones at once each removed the other's half.
    The second waits for the first's export, then finds it made."""
    import sys

    _two_patch_series(fake_project)
    dest = paths.build_dir("upstream-src")
    holder = holders("build:upstream-src")  # the same lock file: an upstream build exporting the pin
    code = "from buun_tool.pipeline import build; print(build.upstream_source())"
    proc = subprocess.Popen([sys.executable, "-c", code],
                            env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = stderr_until(proc, "...")
        assert f"(PID {holder.pid}) to finish with the upstream source {dest}" in seen, seen
        assert not dest.exists()
        release(holder)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == str(dest), err
    assert "int option_3 = 3;" in (dest / "common/arg.cpp").read_text()


def test_upstream_copies_the_settings_of_buuns_build(llama_bin: Path) -> None:
    stamp = build.read_stamp("cpu")
    assert stamp is not None
    up = build.upstream_plan()
    assert (up.variant, up.ui, up.upstream) == ("cpu", stamp["ui"], True)
    assert [a for a in up.cmake_args if "LAUNCHER" not in a] == stamp["cmake_args"]


@pytest.mark.slow
def test_an_unchanged_upstream_rebuild_is_a_noop(upstream_build_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUUN_BUILD_DIR", str(upstream_build_dir))
    log = upstream_build_dir / "upstream-cpu" / "build.log"
    before = log.stat().st_mtime_ns
    result = runner.invoke(app, ["build", "--upstream", "--cpu", "--ui", "none", "--json"])  # as the fixture built it
    assert result.exit_code == 0, result.output
    assert '"rebuilt": false' in result.stdout and '"variant": "upstream-cpu"' in result.stdout
    assert log.stat().st_mtime_ns == before
    assert build.find_upstream_binary("llama-server") == upstream_build_dir / "upstream-cpu" / "bin" / "llama-server"
    assert build.find_binary("llama-server") == upstream_build_dir / "cpu" / "bin" / "llama-server"  # buun's, beside


# A stand-in for `cmake` as a build runs it: it starts a "compiler" in a process group of its own
# (as ninja does), says nothing, and, like cmake --build, lets SIGTERM wait for its child's end.
FAKE_CMAKE = """#!{python}
import os, signal, subprocess, sys
compiler = subprocess.Popen(["sleep", "60"], start_new_session=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after: the compiler would inherit SIG_IGN
with open({pids!r}, "w") as f:
    f.write(f"{{os.getpid()}} {{compiler.pid}}")
compiler.wait()
"""


def _build_with_a_silent_cmake(tmp_path: Path) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """A real `python -m buun_tool build` of the fake project, its cmake the stand-in; returns once
    the stand-in's "compiler" runs, with [cmake, compiler]."""
    import os
    import sys
    import time

    vendor.vendor()
    bin_dir, pids = tmp_path / "bin", tmp_path / "pids"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE.format(python=sys.executable, pids=str(pids)))
    (bin_dir / "cmake").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "buun_tool", "build", "--cpu", "--ui", "none"], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not (pids.exists() and pids.read_text()):
        proc.kill()
        pytest.fail(f"the fake cmake did not start: {proc.communicate()}")
    return proc, [psutil.Process(int(p)) for p in pids.read_text().split()]


def _gone(p: psutil.Process, timeout: float = 0.0) -> bool:
    """Exited within `timeout` (a zombie has: reaping it is its parent's business)."""
    try:
        p.wait(timeout)
        return True
    except psutil.TimeoutExpired:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True


def test_a_killed_build_takes_its_cmake_along(fake_project: FakeProject, tmp_path: Path) -> None:
    """SIGKILL (the OOM killer while a build takes the memory) runs no code of buun's: its cmake
    went on until it next wrote to the pipe buun no longer read (proc.dies_with_us, which only
    reaches the child: the "compiler" below it ends with its work)."""
    proc, (cmake, compiler) = _build_with_a_silent_cmake(tmp_path)
    try:
        proc.kill()
        proc.communicate()
        assert _gone(cmake, 5), "cmake outlived the build that ran it"
    finally:
        for p in (cmake, compiler):
            if p.is_running():
                p.kill()


def test_a_terminated_build_stops_what_cmake_started(fake_project: FakeProject, tmp_path: Path) -> None:
    """SIGTERM unwinds `buun build`: its cmake and the "compilers" below it, in process groups of
    their own, are stopped before buun exits (killing cmake alone left them running)."""
    proc, (cmake, compiler) = _build_with_a_silent_cmake(tmp_path)
    try:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert err.strip().splitlines()[-1] == "stopped by SIGTERM: re-run the same command to resume", err
        assert _gone(cmake) and _gone(compiler)
    finally:
        for p in (cmake, compiler):
            if p.is_running():
                p.kill()
