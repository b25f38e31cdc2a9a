"""The llama-server settings that decide GPU memory (FitFlags), read from a recipe or from
llama-server flags and checked: the tree budget against the ubatch, the slots, and the ubatch
(and batch) raised to hold every slot's verify.

    flags_from_recipe(recipe)         -> FitFlags
    flags_from_server_flags(flags)    -> FitFlags of {name: value} in any spelling
    with_slots(recipe, flags, n)      -> the flags for n slots

(memory.py prices them by component, fit.py plans with them.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from buun_tool.base import command
from buun_tool.base import tree_budget as budgets
from buun_tool.base.errors import UsageError
from buun_tool.formats.recipes import MAX_SLOTS, Recipe

FIT = "fit"  # a recipe's `-c: fit`: the largest context that fits the GPU found at launch
# llama-server's spellings of the tree budget (patch 0023)
TREE_BUDGET_FLAGS = ("--spec-tree-budget", "--tree-budget", "--ddtree-budget")


@dataclass(frozen=True)
class FitFlags:
    """The llama-server settings that decide memory (upstream names in comments)."""

    ctx: int = 6048  # -c
    n_parallel: int = 1  # -np
    cache_type_k: str = "f16"  # -ctk
    cache_type_v: str = "f16"  # -ctv
    draft_max: int = 15  # --spec-draft-n-max; 0 = autoregressive, no drafter
    draft_ctx: int | None = None  # -cd; None = the target's context
    draft_cache_type: str = "f16"  # -ctkd / -ctvd
    batch: int = 256  # -b
    ubatch: int = 64  # -ub
    rollback: str = "tape"  # LLAMA_RS_ROLLBACK, one of patches.ROLLBACKS
    tree_budget: int = 0  # --spec-tree-budget; 0 or 1 verifies the chain

    @property
    def spec(self) -> bool:
        return self.draft_max > 0

    @property
    def tree(self) -> bool:
        return self.spec and budgets.is_tree(self.tree_budget)

    @property
    def rs_rows(self) -> int:
        """n_rs_seq: the tokens a verify may roll back, the draft's n_max or a larger tree. A
        budget under n_max counts as n_max: the server still sizes its context for the draft, and
        the planner errs on the side that fits."""
        return max(self.draft_max, self.tree_budget) if self.tree else self.draft_max

    @property
    def verify_width(self) -> int:
        """Tokens of one sequence's verify batch: the last token and the rolled-back rows."""
        return self.rs_rows + 1 if self.spec else 1

    def describe(self) -> str:
        kv = self.cache_type_k if self.cache_type_k == self.cache_type_v else f"{self.cache_type_k}/{self.cache_type_v}"
        text = f"-c {self.ctx} -np {self.n_parallel} KV {kv} -b {self.batch} -ub {self.ubatch}"
        if self.spec:
            text += f", DFlash n_max {self.draft_max}, draft ctx {self.draft_ctx or self.ctx}"
        if self.tree:
            text += f", tree budget {self.tree_budget}"
        return text + ("" if self.spec else ", AR (no drafter)")


def _int_flag(flags: Mapping[str, Any], name: str) -> int | None:
    """An option's number in any of its spellings (command.ALIAS_GROUPS); None when absent or `fit`."""
    value = command.option(flags, name)
    if value is None or value is True or str(value) == FIT:
        return None
    if not command.is_count(str(value)):
        raise UsageError(f"{name} {value}: expected a whole number",
                         f"give {name} a number of tokens (or slots, for -np)")
    return int(value)


def flags_from_recipe(recipe: Recipe) -> FitFlags:
    """The memory-relevant settings of the recipe's server flags (fork or upstream spelling) and
    its tree budget (`server.tree.budget`; a budget among the flags wins, as it does in serve)."""
    f = flags_from_server_flags(recipe.server_flags)
    f = f if f.tree_budget else replace(f, tree_budget=recipe.tree_budget)
    has_np = command.option(recipe.server_flags, "-np") is not None
    return f if has_np else with_slots(recipe, f, recipe.slots)


def flags_from_server_flags(f: Mapping[str, Any]) -> FitFlags:
    """The memory-relevant settings of llama-server flags given as {name: value}."""
    base = FitFlags()
    ctk = str(command.option(f, "-ctk", base.cache_type_k))
    return FitFlags(
        ctx=_int_flag(f, "-c") or base.ctx,
        n_parallel=_int_flag(f, "-np") or base.n_parallel,
        cache_type_k=ctk,
        cache_type_v=str(command.option(f, "-ctv", ctk)),
        draft_max=_int_flag(f, "--draft-max") or base.draft_max,
        draft_ctx=_int_flag(f, "-cd"),
        batch=_int_flag(f, "-b") or base.batch,
        ubatch=_int_flag(f, "-ub") or base.ubatch,
        tree_budget=_int_flag(f, command.TREE_BUDGET) or base.tree_budget,
    )




def check_tree(f: FitFlags) -> None:
    """A tree is decoded in one ubatch (patch 0021 asserts it): budget + 1 tokens must fit -ub."""
    ub = min(f.ubatch, f.batch)
    width = f.tree_budget + 1
    if f.tree and width > ub:
        raise UsageError(f"a tree budget of {f.tree_budget} verifies {width} tokens in one ubatch, more than -ub {ub}",
                         f"pass a budget of at most {ub - 1}, or a larger ubatch (`-- -ub {width} "
                         f"-b {max(f.batch, width)}`)")


# --- slots -----------------------------------------------------------------------------------
# -c is the whole context: llama-server gives each of -np slots its share (fit.py plans them).

def slot_verify_rows(recipe: Recipe, f: FitFlags) -> int:
    """Tokens one slot's verify adds to the batch: its drafts (the block less one at most) and the
    last token."""
    d = recipe.geometry_at("full").drafter
    return min(f.draft_max, d.block_size - 1) + 1 if f.spec else 1


def with_slots(recipe: Recipe, f: FitFlags, n: int) -> FitFlags:
    """The flags for n slots, with the ubatch (and batch) raised to hold every slot's verify: the
    slots then verify in one target forward and keep their features on the device (patch 0014)."""
    check_slots(f, n)
    ub = max(f.ubatch, n * slot_verify_rows(recipe, f))
    return replace(f, n_parallel=n, ubatch=ub, batch=max(f.batch, ub))


def check_slots(f: FitFlags, n: int) -> None:
    if not 1 <= n <= MAX_SLOTS:
        raise UsageError(f"{n} slots: buun serves 1 to {MAX_SLOTS}",
                         f"pass --slots between 1 and {MAX_SLOTS}")
    if n > 1 and f.tree:
        raise UsageError(f"a DDTree (tree budget {f.tree_budget}) verifies one slot: llama-server serves "
                         f"{n} slots with chains", f"pass --tree-budget 0 with --slots {n}, or --slots 1")
