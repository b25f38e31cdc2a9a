"""`buun setup` asks the Hub in its first stage, before the build: a Hub out of reach or a repo that
is not there is said in seconds, with pull's own message, not after a 10-20 minute build (issue
#47: `buun setup --cpu` built for 10 minutes, then said the Hub was unreachable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from buun_tool.base.errors import Exit
from buun_tool.server.process import free_port
from tests.support.fake_hub import FakeHub
from tests.support.tiny_checkpoints import write_recipe


def _setup(recipe_file: Path, models: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe_file), "--cpu", "--yes",
           "--models-dir", str(models)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def test_a_hub_out_of_reach_stops_setup_before_the_build(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = _setup(write_recipe(tmp_path / "tiny.yaml"), tmp_path / "models", {"HF_ENDPOINT": closed})
    assert out.returncode == Exit.NETWORK, out.stderr[-2000:]
    assert f"cannot reach the Hub at {closed}" in out.stderr and "==> doctor:" in out.stderr
    for later in ("vendor", "patch", "build", "pull"):  # neither run nor looked at
        assert f"==> {later}:" not in out.stderr and f"{later}: current" not in out.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").rglob("*.gguf"))


def test_a_repo_the_hub_does_not_have_stops_setup_before_the_build(fake_hub: FakeHub, tmp_path: Path) -> None:
    """The fake Hub answers, but holds none of the recipe's repos: pull's not-found error, exit 5."""
    out = _setup(write_recipe(tmp_path / "tiny.yaml"), tmp_path / "models")
    assert out.returncode == Exit.NOT_FOUND, out.stderr[-2000:]
    assert "does not exist on" in out.stderr and "==> build:" not in out.stderr and "==> vendor:" not in out.stderr
