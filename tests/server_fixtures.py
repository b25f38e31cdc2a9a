"""Fixtures for the server tests: the CPU build's llama-server with the tiny random-weight
target + DFlash drafter pair (`tiny_pair`, from tests/models.py), free ports, the `buun` CLI as a
subprocess, and a clean-up that ends every process a test started (even when it fails): each
test has its own BUUN_STATE_DIR, every process buun starts inherits it, and a scan of the
process table finds them all.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from buun_tool.base import command
from buun_tool.formats import recipes
from buun_tool.measure.bench_configs import UPSTREAM
from tests.server_helpers import Buun


@pytest.fixture(scope="session")
def compat_args(llama_bin: Path) -> list[str]:
    """buun options that make the recipe's flags run on a llama-server without the compatibility
    patch (pinned upstream): `buun bench`'s upstream set (bench_configs.UPSTREAM) as `buun serve`
    arguments; empty with the patch: the recipe's flags are then used unchanged. The recipe flags
    it touches are tried for real: `llama-server FLAG VALUE --help` fails on an unknown one."""
    def accepted(flag: str, value: str | None) -> bool:
        r = subprocess.run([str(llama_bin / "llama-server"), flag, *([value] if value else []), "--help"],
                           capture_output=True, timeout=60)
        return r.returncode == 0

    base = command.recipe_flags(recipes.load().server_flags)
    touched = {command.canonical(n) for (n, _), _ in UPSTREAM.respell} | {command.canonical(d) for d in UPSTREAM.drop}
    if all(accepted(n, v) for n, v in base if command.canonical(n) in touched):
        return []
    sets, drops = UPSTREAM.serve_args(base)
    return [f"--drop={d}" for d in drops] + ["--", *(t for n, v in sets for t in (n, *([v] if v else [])))]


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in llama-server (BUUN_LLAMA_BIN_DIR) for what needs only its path and never runs
    it (`buun serve --print-cmd`, a bench configuration's argv)."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "llama-server").write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(d))
    return d


@pytest.fixture
def buun(isolated_dirs: Path, tiny_pair: tuple[Path, Path], compat_args: list[str]) -> Iterator[Buun]:
    b = Buun(isolated_dirs / "state", tiny_pair, compat_args)
    try:
        yield b
    finally:
        left = b.ours()
        for p in left:  # a failed test may leave some: no test leaks processes into the next
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=5)
