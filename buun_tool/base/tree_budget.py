"""A DDTree budget: the draft nodes a tree step verifies, 0 and 1 being the chain (llama-server's
default, which needs no flag). One parser for every place a budget is written: `--tree-budget` of
serve/start/fit, bench's list of budgets, and llama-server's own `--spec-tree-budget` among the
flags after `--` or in a recipe."""

from __future__ import annotations

from buun_tool.base.command import is_count
from buun_tool.base.errors import UsageError

HINT = "0 (or 1) verifies the chain; 22 verifies a tree of 22 draft tokens (docs/tree.md)"


def is_tree(n: int) -> bool:
    """Whether a budget verifies a tree (2 draft nodes or more) rather than the chain."""
    return n > 1


def check(n: int, option: str) -> int:
    """A budget given as a number: 0 or more draft nodes."""
    if n < 0:
        raise UsageError(f"{option} {n}: expected 0 or more draft nodes", HINT)
    return n


def parse(value: str | None, option: str) -> int:
    """A budget given as text (a flag's value, or none)."""
    if value is None or not is_count(value):
        shown = option + (f" {value}" if value is not None else " without a value")
        raise UsageError(f"{shown}: expected a whole number of draft nodes, 0 or more", HINT)
    return int(value)


def parse_list(given: str, option: str = "--tree-budget") -> list[int]:
    """Several budgets ("8,16,22,32"), the chain (0) first and each once (1 is the chain too)."""
    items = [v.strip() for v in given.split(",") if v.strip()]
    if not items or not all(is_count(v) for v in items):
        raise UsageError(f"{option} {given!r}: expected a comma-separated list of draft-node budgets, 0 or more",
                         f"for example {option} 8,16,22,32 (the chain, budget 0, is always added)")
    return list(dict.fromkeys([0] + [int(v) if is_tree(int(v)) else 0 for v in items]))
