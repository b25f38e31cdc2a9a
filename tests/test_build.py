"""`buun build`: the plan (flags, arch, UI), the no-op rebuild and the binary lookup, against the
real CPU build of this checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool import build, paths
from buun_tool.cli.app import app
from buun_tool.errors import NotReadyError, UsageError

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
    monkeypatch.setattr(build, "detect_gpus", lambda: [build.Gpu("NVIDIA GeForce RTX 3090", "8.6", 24576, "580")])
    assert "-DCMAKE_CUDA_ARCHITECTURES=86" in build.plan(ui="none").cmake_args  # picked without --cuda
    monkeypatch.setattr(build, "detect_gpus", lambda: [])
    with pytest.raises(UsageError, match="--cuda-arch"):
        build.plan(cuda=True, ui="none")


def test_cpu_plan_and_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "detect_gpus", lambda: [])
    p = build.plan(ui="build")
    assert p.variant == "cpu" and "-DGGML_CUDA=OFF" in p.cmake_args and "-DLLAMA_BUILD_UI=ON" in p.cmake_args
    assert not any("CUDA_ARCHITECTURES" in a for a in p.cmake_args)
    with pytest.raises(UsageError):
        build.plan(cpu=True, cuda=True)
    with pytest.raises(UsageError):
        build.plan(cpu=True, ui="sometimes")
