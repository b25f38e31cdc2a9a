"""Synthetic tree acceptance: the profile that stands in for a real drafter when a DDTree verify is
measured on random weights.

In a step, each draft depth is easy or hard for the drafter, independently: hard with probability
U. At an easy depth the target's token is the drafter's rank-1 candidate with probability
EASY_TOP1; at a hard one with probability `hard_top1`, and the other ranks share the rest of the
top-K mass (EASY_MASS or HARD_MASS) geometrically (ratio RATIO); the remainder lies outside the top
K. The drafter's log-probabilities are those rates, so the tree builder (common/ddtree.h, patch
0020) puts its branches where this step's drafter is unsure, as it does with a real drafter. The
expected acceptance length of a tree (the bonus token included) is 1 plus the sum over its nodes
of their path probabilities (DDTree, Prop. 1); `tree_al` averages that exactly over the 2^15
easy/hard patterns, each with its own best tree, seeded with the top-1 chain and grown best-first
as the server's builder grows it (`expected_al`).

The default profile is calibrated to the HumanEval figures of Lucebox on an RTX 3090 with
Qwen3.5-27B Q4_K_M: acceptance length 7.67 for the chain of 15 and 8.31 for a tree of budget 22.
`hard_top1` and U are solved for the two figures (`calibrate`). Profiles with the same rates at
every step (no easy/hard split) did not reach them: in the families tried, with a drafter whose
ranks are its own order of likelihood and a chain of 7.67, a budget-22 tree gained at most 0.55
(docs/tree.md).

`synth_tree_value` writes a profile as llama-server's `--spec-synth-tree` value (patch 0023), with
which a server feigns this acceptance for its chain or its tree; `buun bench --tree-budget` serves
the default profile so.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

DEPTH = 15  # a DFlash block of 16: the bonus token and 15 drafted positions
K = 8  # candidates per position
EASY_TOP1 = 0.97
EASY_MASS = 0.99  # the top K's share at an easy depth
HARD_MASS = 0.9
RATIO = 0.4  # ranks 2..K: each this much less likely than the one before
CHAIN_AL = 7.67
TREE_BUDGET = 22
TREE_AL = 8.31


def _row(top1: float, mass: float) -> list[float]:
    geo = [RATIO**i for i in range(K - 1)]
    return [top1] + [(mass - top1) * g / sum(geo) for g in geo]


@dataclass(frozen=True)
class Profile:
    u: float  # the probability that a depth is hard in a step
    hard_top1: float

    def rows(self) -> tuple[list[float], list[float]]:
        """The rates of an easy and of a hard depth: rates[r], the probability that the target's
        token is the drafter's rank-(r + 1) candidate."""
        return _row(EASY_TOP1, EASY_MASS), _row(self.hard_top1, HARD_MASS)

    def chain_al(self) -> float:
        a = (1 - self.u) * EASY_TOP1 + self.u * self.hard_top1
        return 1.0 + sum(a**d for d in range(1, DEPTH + 1))

    def served_al(self, budget: int) -> float:
        """The expected acceptance length of a server given `--spec-tree-budget budget` and this
        profile (`--spec-synth-tree`): at 0 or 1 it verifies the chain, else the best tree."""
        return self.chain_al() if budget <= 1 else self.tree_al(budget)

    def tree_al(self, budget: int, seed_chain: bool = True) -> float:
        """The expected acceptance length of a step's best tree of `budget` nodes, over every
        pattern of easy and hard depths."""
        easy, hard = self.rows()
        total = 0.0
        for pattern in itertools.product((False, True), repeat=DEPTH):
            n_hard = sum(pattern)
            weight = self.u**n_hard * (1 - self.u) ** (DEPTH - n_hard)
            total += weight * expected_al([hard if h else easy for h in pattern], budget, seed_chain)
        return total


def expected_al(rates: list[list[float]], budget: int, seed_chain: bool = True) -> float:
    """The expected acceptance length of the best tree of `budget` nodes under `rates`."""
    probs: list[float] = []  # accepted nodes' path probabilities
    heap: list[tuple[float, int, int, int]] = []  # (-prob, depth, rank, parent)

    def parent_prob(parent: int) -> float:
        return 1.0 if parent < 0 else probs[parent]

    def open_after(i: int, depth: int, rank: int, parent: int, child: bool) -> None:
        if rank + 1 < len(rates[depth]):
            heapq.heappush(heap, (-parent_prob(parent) * rates[depth][rank + 1], depth, rank + 1, parent))
        if child and depth + 1 < len(rates):
            heapq.heappush(heap, (-probs[i] * rates[depth + 1][0], depth + 1, 0, i))

    if seed_chain:
        for depth in range(min(len(rates), budget)):
            probs.append(parent_prob(depth - 1) * rates[depth][0])
        for i in range(len(probs)):
            open_after(i, i, 0, i - 1, child=i == len(probs) - 1)
    elif budget > 0:
        heapq.heappush(heap, (-rates[0][0], 0, 0, -1))
    while len(probs) < budget and heap:
        neg, depth, rank, parent = heapq.heappop(heap)
        probs.append(-neg)
        open_after(len(probs) - 1, depth, rank, parent, child=True)
    return 1.0 + sum(probs)


def _bisect(f: Callable[[float], float], lo: float, hi: float, target: float, increasing: bool,
            steps: int = 50) -> float:
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def calibrate(chain_al: float = CHAIN_AL, tree_budget: int = TREE_BUDGET, tree_al: float = TREE_AL) -> Profile:
    """hard_top1 and U such that the chain gives `chain_al` and the best tree of `tree_budget`
    nodes `tree_al` (about half a minute). For a given hard_top1, U follows from the chain alone;
    the surer the drafter at a hard depth, the less a tree adds over the chain."""

    def with_top1(top1: float) -> Profile:
        u = _bisect(lambda u: Profile(u, top1).chain_al(), 0.0, 1.0, chain_al, False)
        return Profile(u, top1)

    top1 = _bisect(lambda x: with_top1(x).tree_al(tree_budget), 0.4, 0.85, tree_al, False, steps=14)
    return with_top1(top1)


# calibrate() rounded to 4 decimals (tests/test_treeprofile.py checks both)
DEFAULT = Profile(u=0.2810, hard_top1=0.6843)


def write_rates(rates: list[list[float]]) -> str:
    """The rates as test-ddtree's --profile reads them: a line per depth."""
    return "".join(" ".join(f"{q:.9g}" for q in row) + "\n" for row in rates)


def synth_tree_value(profile: Profile) -> str:
    """The profile as llama-server's `--spec-synth-tree U:E1,...,EK:H1,...,HK` (patch 0023): U, then
    the easy and the hard row of `rows()`. Each number is written in Python's shortest round-trip
    form, so the server's strtod reads back exactly these rates and a measured AL is compared with
    `tree_al` of the same numbers, not of rounded ones."""
    easy, hard = profile.rows()
    return ":".join([repr(profile.u), ",".join(map(repr, easy)), ",".join(map(repr, hard))])


def parse_synth_tree(value: str) -> tuple[float, list[float], list[float]]:
    """(U, easy row, hard row) of a `--spec-synth-tree` value, checked as the server checks it:
    U and every rate in [0, 1], rows of the same length whose sum is at most 1."""
    parts = value.split(":")
    if len(parts) != 3:
        raise ValueError(f"{value!r}: expected U:E1,...,EK:H1,...,HK (three parts separated by ':')")
    u = float(parts[0])
    easy, hard = ([float(x) for x in part.split(",")] for part in parts[1:])
    if len(easy) != len(hard):
        raise ValueError(f"{value!r}: the easy row has {len(easy)} rates, the hard row {len(hard)}")
    for q in (u, *easy, *hard):
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"{value!r}: {q!r} is not a probability")
    for row in (easy, hard):
        if sum(row) > 1.0 + 1e-9:
            raise ValueError(f"{value!r}: a row's rates sum to {sum(row):.6g}, more than 1")
    return u, easy, hard
