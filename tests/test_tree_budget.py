"""The one parser of a DDTree budget (buun_tool/base/tree_budget.py): what serve, fit, bench and a
--spec-tree-budget among llama-server's flags accept, and what they say otherwise."""

from __future__ import annotations

import pytest

from buun_tool.base import tree_budget
from buun_tool.base.errors import UsageError


def test_a_budget_of_two_or_more_is_a_tree() -> None:
    assert [tree_budget.is_tree(n) for n in (0, 1, 2, 22)] == [False, False, True, True]


def test_a_flags_value_is_a_whole_number() -> None:
    assert tree_budget.parse("22", "--spec-tree-budget") == 22
    for bad in (None, "", "-1", "2.5", "²", "x"):
        with pytest.raises(UsageError, match="expected a whole number of draft nodes") as e:
            tree_budget.parse(bad, "--spec-tree-budget")
        assert e.value.hint == tree_budget.HINT


def test_a_number_given_is_zero_or_more() -> None:
    assert tree_budget.check(0, "--tree-budget") == 0
    with pytest.raises(UsageError, match="--tree-budget -1: expected 0 or more draft nodes"):
        tree_budget.check(-1, "--tree-budget")


def test_a_list_puts_the_chain_first_once() -> None:
    assert tree_budget.parse_list("22, 8,1,22") == [0, 22, 8]
    with pytest.raises(UsageError, match="--tree-budget '8,x': expected a comma-separated list"):
        tree_budget.parse_list("8,x")
