"""`buun doctor`: the disk check measures the models folder the command resolved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.cli.app import app
from buun_tool.pipeline import build, vendor
from tests.support.fake_gpus import write_nvidia_smi


def _disk(*args: str) -> str:
    r = CliRunner().invoke(app, ["doctor", "--cpu", "--json", *args])
    return next(c["detail"] for c in json.loads(r.stdout)["checks"] if c["name"] == "disk")


def test_the_disk_check_looks_where_the_models_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmp_path / "big-disk"
    disk.mkdir()
    # a folder not made yet is measured at its nearest parent that exists
    assert f"free at {disk}," in _disk("--models-dir", str(disk / "models"))
    monkeypatch.setenv("BUUN_MODELS_DIR", str(disk))
    assert f"free at {disk}," in _disk()


def test_a_file_where_the_models_folder_goes_fails(tmp_path: Path) -> None:
    """Before: "ok, N GiB free at FILE" (disk_usage measures a file's disk too), and `buun setup`
    then failed at its first download."""
    file = tmp_path / "models.txt"
    file.write_text("")
    for given in (file, file / "models"):
        r = CliRunner().invoke(app, ["doctor", "--cpu", "--json", "--models-dir", str(given)])
        disk = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "disk")
        assert r.exit_code == 1 and disk["status"] == "fail", disk
        assert disk["detail"] == f"{file} is a file: the models folder {given} cannot be made there"


def _build_check(build_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("BUUN_BUILD_DIR", str(build_dir))
    r = CliRunner().invoke(app, ["doctor", "--cpu", "--json"])
    return next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "build (cpu)")


def test_a_stale_build_is_not_ok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's line is the build stage's own answer (what `buun setup` and `buun build` judge),
    not "a stamp exists": a tree patched since the build warns, with the command that rebuilds it."""
    p = build.plan(cpu=True, ui="none")
    stamp = build._stamp_for(p, vendor.require_vendored())
    folder = tmp_path / "build"
    (folder / "cpu" / "bin").mkdir(parents=True)
    for name in p.targets:
        (folder / "cpu" / "bin" / name).touch()
    (folder / "cpu" / build.STAMP).write_text(json.dumps(stamp))
    assert _build_check(folder, monkeypatch)["status"] == "ok"

    (folder / "cpu" / build.STAMP).write_text(json.dumps({**stamp, "source": {"tree": "0" * 40}}))
    check = _build_check(folder, monkeypatch)
    assert check["status"] == "warn", check
    assert "is stale: changed since the cpu build: the patched source tree" in check["detail"]
    assert "buun build --cpu" in check["fix"]


def test_setup_checks_the_cards_with_one_nvidia_smi_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup's doctor stage reads the cards once, for doctor's GPU lines and its GPU-memory check
    alike: it ran nvidia-smi's query a second time for the memory check."""
    from buun_tool.app import setup
    from buun_tool.formats import recipes
    from buun_tool.pipeline import doctor

    smi = write_nvidia_smi(tmp_path / "bin", [("NVIDIA H200", "9.0", 143771)])
    calls = tmp_path / "calls"
    smi.write_text(smi.read_text().replace("#!/bin/sh\n", f'#!/bin/sh\necho "$1" >> "{calls}"\n', 1))
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "disk_needed", lambda recipe: 0)  # this machine's free space is not the point
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nor the Hub, which the stage asks when models are missing
    setup._doctor(setup.Context(recipes.load(), tmp_path / "models"))
    assert calls.read_text().splitlines() == ["--query-gpu=name,compute_cap,memory.total,driver_version"]
