"""`buun doctor`: the disk check measures the models folder the command resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.cli.app import app


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
