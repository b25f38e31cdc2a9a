"""The tree forms of the gated delta net and the short conv (patch 0001), on the build under test.

`test-tree-ssm` runs each op over trees of tokens (a chain, a star, a forest, DDTree-like trees of
budget 22 and 31, a bushy one longer than the chain kernels' 32-token path) on every backend of the
build and compares every node with the chain op over the path from its root: bit for bit on the
CPU. Each tree also runs with a planted bug (every branch token's parent moved back by one), which
the comparison must catch. On a GPU machine `scripts/gpu_run.sh tree-ops` runs the same binary on CUDA.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

slow = pytest.mark.slow

TREES = ("chain 16", "star 9", "forest", "ddtree spine 16 + 7", "ddtree spine 16 + 16", "ddtree spine 5 + 40")


def _run(llama_bin: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(llama_bin / "test-tree-ssm"), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cpu_run(llama_bin: Path) -> subprocess.CompletedProcess[str]:
    """One run of every check on the CPU backend, read by the tests below."""
    return _run(llama_bin, "-b", "CPU")


@slow
def test_tree_ops_match_the_chain_ops_along_every_path(cpu_run: subprocess.CompletedProcess[str]) -> None:
    r = cpu_run
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CPU ")]
    # every op and tree shape was checked, exactly on the CPU
    for op in ("gdn     ", "gdn kda ", "conv    "):
        for tree in TREES:
            line = next((ln for ln in lines if re.search(rf"\b{re.escape(op)}\s+{re.escape(tree)}\s+ok", ln)), None)
            assert line is not None, f"{op.strip()} {tree}: not checked\n{r.stdout}"
            assert line.endswith("(max rel err 0)"), line
    assert re.search(r"^28 passed, 0 failed$", r.stdout, re.M), r.stdout


@slow
def test_a_parent_off_by_one_is_caught(cpu_run: subprocess.CompletedProcess[str]) -> None:
    r = cpu_run
    caught = [ln for ln in r.stdout.splitlines() if "planted bug caught" in ln]
    # every tree with a branch (all but the chain) plants the bug in both ops
    assert len(caught) == 10, r.stdout
    for ln in caught:
        assert " ok " in ln, ln
        err = float(re.search(r"max rel err ([0-9.e+-]+)", ln).group(1))
        assert err > 0.1, ln  # a wrong parent moves the outputs by far more than rounding


@slow
def test_an_unknown_backend_is_refused(llama_bin: Path) -> None:
    r = _run(llama_bin, "-b", "NOPE")
    assert r.returncode == 2 and "no backend named NOPE" in r.stderr
