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

from buun_tool import recipes
from tests.server_helpers import Buun

# Upstream spellings of the fork's flags the recipe uses, for a build without the compatibility patch.
UPSTREAM = {"--spec-type": ("--spec-type", "draft-dflash"), "--draft-max": ("--spec-draft-n-max", None),
            "--draft-min": ("--spec-draft-n-min", None), "-cd": (None, None)}


@pytest.fixture(scope="session")
def compat_args(llama_bin: Path) -> list[str]:
    """buun options that make the recipe's flags run on a llama-server without the compatibility
    patch (pinned upstream); empty with the patch: the recipe's flags are then used unchanged.
    Each recipe flag is tried for real: `llama-server FLAG VALUE --help` fails on an unknown one."""
    def accepted(flag: str, value: str) -> bool:
        r = subprocess.run([str(llama_bin / "llama-server"), flag, value, "--help"], capture_output=True,
                           timeout=60)
        return r.returncode == 0

    flags = recipes.load().server_flags
    drops: list[str] = []
    extra: list[str] = []
    for flag, (upstream, value) in UPSTREAM.items():
        if accepted(flag, str(flags[flag])):
            continue
        if upstream is None:
            drops.append(f"--drop={flag}")
        else:
            extra += [upstream, value or str(flags[flag])]
    return drops + (["--", *extra] if extra else [])


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
