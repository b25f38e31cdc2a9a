"""The synthetic tree-acceptance profile (buun_tool/treeprofile.py) and the DDTree builder of patch
0020 (common/ddtree.h, checked by its own test-ddtree against brute force): the default profile
gives the HumanEval acceptance lengths it was calibrated to, and the C++ builder and the Python
calibration agree on the trees they build."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from buun_tool.measure import treeprofile

slow = pytest.mark.slow


@slow
def test_the_default_profile_is_the_calibrated_one() -> None:
    p = treeprofile.calibrate()
    assert p.u == pytest.approx(treeprofile.DEFAULT.u, abs=1e-3)
    assert p.hard_top1 == pytest.approx(treeprofile.DEFAULT.hard_top1, abs=1e-3)


def test_the_default_profile_gives_the_chain_and_tree_figures() -> None:
    p = treeprofile.DEFAULT
    for row in p.rows():
        assert len(row) == treeprofile.K and sum(row) <= 1.0 and row == sorted(row, reverse=True)
    assert p.chain_al() == pytest.approx(7.67, abs=2e-3)
    assert p.tree_al(treeprofile.DEPTH) == pytest.approx(p.chain_al())  # 15 nodes: the chain itself
    assert p.tree_al(22) == pytest.approx(8.31, abs=2e-3)
    # a budget-16 tree (the chain's verify width) beats the chain; more nodes never lose
    als = [p.tree_al(b) for b in (15, 16, 22, 32)]
    assert als == sorted(als) and als[1] > als[0]


def test_a_single_candidate_per_position_is_the_chain() -> None:
    rates = [[0.9] for _ in range(15)]
    chain = 1 + sum(0.9**d for d in range(1, 16))
    assert treeprofile.expected_al(rates, 22) == pytest.approx(chain)
    assert treeprofile.expected_al(rates, 22, seed_chain=False) == pytest.approx(chain)


@slow
def test_the_tree_builder_passes_its_brute_force_checks(llama_bin: Path) -> None:
    r = subprocess.run([str(llama_bin / "test-ddtree")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\d+ passed, 0 failed$", r.stdout, re.M) and "FAIL" not in r.stdout


@slow
@pytest.mark.parametrize("seed", [True, False])
def test_the_tree_builder_agrees_with_the_calibration(llama_bin: Path, tmp_path: Path, seed: bool) -> None:
    easy, hard = treeprofile.DEFAULT.rows()
    f = tmp_path / "profile.txt"
    for pattern in ("e" * 15, "h" * 15, "eeheeehhheeheee", "hhe" * 5):
        rates = [hard if c == "h" else easy for c in pattern]
        f.write_text(treeprofile.write_rates(rates))
        for budget in (1, 15, 16, 22, 32, 64):
            cmd = [str(llama_bin / "test-ddtree"), "--profile", str(f), "--budget", str(budget)]
            r = subprocess.run(cmd + ([] if seed else ["--no-seed"]), capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            m = re.fullmatch(r"nodes (\d+) branch (\d+) al ([0-9.]+)\n", r.stdout)
            assert m, r.stdout
            assert int(m.group(1)) == budget
            assert float(m.group(3)) == pytest.approx(treeprofile.expected_al(rates, budget, seed), abs=1e-4)


@pytest.mark.parametrize("profile", [treeprofile.DEFAULT, treeprofile.Profile(u=0.1, hard_top1=0.5),
                                     treeprofile.Profile(u=1 / 3, hard_top1=0.7)])
def test_the_servers_value_reads_back_as_the_same_rows(profile: treeprofile.Profile) -> None:
    value = treeprofile.synth_tree_value(profile)
    u, easy, hard = treeprofile.parse_synth_tree(value)
    assert (u, easy, hard) == (profile.u, *profile.rows())  # exactly: no digit lost on the way
    assert value.count(":") == 2 and len(easy) == len(hard) == treeprofile.K


@pytest.mark.parametrize("value, message", [
    ("0.3:0.9,0.05", "three parts"),
    ("0.3:0.9,0.05:0.6", "the easy row has 2 rates, the hard row 1"),
    ("1.5:0.9:0.6", "1.5 is not a probability"),
    ("0.3:0.9,0.2:0.6,0.1", "sum to 1.1"),
])
def test_a_bad_value_says_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        treeprofile.parse_synth_tree(value)


def test_a_server_at_budget_0_or_1_verifies_the_chain() -> None:
    p = treeprofile.DEFAULT
    assert p.served_al(0) == p.served_al(1) == pytest.approx(7.67, abs=2e-3)
    assert p.served_al(22) == p.tree_al(22)
