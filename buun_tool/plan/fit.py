"""The VRAM fit planner: GPU memory of a target + DFlash drafter server, by component, and the
largest context and the slots that fit.

    predict(recipe, FitFlags(ctx=6048, draft_max=15)) -> Prediction
    max_context(recipe, flags, gpu_gib)               -> the largest -c that fits
    slot_plans(recipe, flags, gpu_gib, margin)        -> per number of slots, the largest context each
    max_slots(recipe, flags, gpu_gib, margin, ctx)    -> how many slots of ctx tokens fit

The parts it adds up: the settings that decide memory (flags.py: FitFlags, read from a recipe or
llama-server's flags), the weights (weights.py: from the GGUFs or the recipe geometry) and the
other components (memory.py: KV cache, recurrent state, compute buffers, CUDA overhead, with what
llama-server allocates for each). Their names are fit's too: callers say fit.FitFlags, fit.cells.
What the real llama-server allocates: measure/fit_measure.py. split.py lays these components over
the cards of a layer split: `buun fit --gpu-mem 24,24`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from buun_tool.base import command
from buun_tool.formats.recipes import MAX_SLOTS, Recipe
from buun_tool.plan.flags import (
    FIT,
    TREE_BUDGET_FLAGS,
    FitFlags,
    check_slots,
    check_tree,
    flags_from_recipe,
    flags_from_server_flags,
    slot_verify_rows,
    with_slots,
)
from buun_tool.plan.memory import (
    CELL_PAD,
    CUDA_ACTIVATIONS,
    CUDA_CONTEXT_MIB,
    DRAFT_CONTEXT_MIB,
    GIB,
    KV_TYPE_BYTES,
    MIB,
    cells,
    draft_cells,
    drafter_compute,
    drafter_kv,
    feature_rows,
    features,
    kv_type_bytes,
    recurrent,
    recurrent_plane,
    recurrent_planes,
    recurrent_tape,
    tape_row,
    target_compute,
    target_compute_parts,
    target_kv,
)
from buun_tool.plan.weights import Weights, default_weights, weights_from_files, weights_from_plan

__all__ = [
    # flags.py
    "FIT", "TREE_BUDGET_FLAGS", "FitFlags", "check_slots", "check_tree",
    "flags_from_recipe", "flags_from_server_flags", "slot_verify_rows", "with_slots",
    # memory.py
    "CELL_PAD", "CUDA_ACTIVATIONS", "CUDA_CONTEXT_MIB", "DRAFT_CONTEXT_MIB", "GIB", "KV_TYPE_BYTES", "MIB", "cells",
    "draft_cells", "drafter_compute", "drafter_kv", "feature_rows", "features", "kv_type_bytes", "recurrent",
    "recurrent_plane", "recurrent_planes", "recurrent_tape", "tape_row", "target_compute", "target_compute_parts",
    "target_kv",
    # weights.py
    "Weights", "default_weights", "weights_from_files", "weights_from_plan",
    # the planner's own
    "MARGIN_GIB", "Component", "Prediction", "predict", "tree_extra", "fits", "max_context", "Knob", "knobs",
    "spelling", "max_context_per_slot", "max_slots", "SlotPlan", "slot_plans", "slot_cost",
]

MARGIN_GIB = 0.25  # kept free on the GPU (display, fragmentation), here and in `buun fit`


# --- prediction ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Component:
    key: str
    label: str
    bytes: int
    detail: str


@dataclass
class Prediction:
    flags: FitFlags
    components: list[Component]
    weights_source: str
    cuda: bool = True

    @property
    def total(self) -> int:
        return sum(c.bytes for c in self.components)

    def get(self, key: str) -> int:
        return sum(c.bytes for c in self.components if c.key == key)

    def to_json(self) -> dict[str, Any]:
        return {"flags": asdict(self.flags), "weights_source": self.weights_source, "total_bytes": self.total,
                "total_gib": self.total / GIB, "components": [asdict(c) for c in self.components]}


def predict(recipe: Recipe, flags: FitFlags, scale: str = "full", weights: Weights | None = None,
            cuda: bool = True) -> Prediction:
    """GPU memory by component. cuda=False predicts a CPU build's buffers instead: the same ones,
    token_embd included in the weights, no CUDA overhead."""
    geo = recipe.geometry_at(scale)  # typed and checked once, when the recipe loaded
    t, d = geo.target, geo.drafter
    w = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    f = flags
    n_cells = cells(f.ctx, f.n_parallel)
    planes = recurrent_planes(f)
    tape_bytes = recurrent_tape(t, f)
    tape = f" + tape {tape_bytes / MIB:.1f} MiB" if tape_bytes else ""
    weights_detail = "all tensors but token_embd (host)" if cuda else "all tensors (CPU build)"
    comps = [
        Component("target_weights", "target weights", w.target_gpu + (0 if cuda else w.target_host), weights_detail),
        Component("target_kv", "target KV cache", target_kv(t, f),
                  f"{t.n_full_attention} full-attention layers x {n_cells} cells, "
                  f"K {f.cache_type_k} V {f.cache_type_v}"),
        Component("recurrent", "recurrent state", recurrent(t, f),
                  f"{planes} plane(s) x {recurrent_plane(t) / MIB:.1f} MiB (delta-net + conv, f32){tape}"),
        Component("target_compute", "target compute buffer", target_compute(t, f, cuda), f"-ub {f.ubatch}"),
    ]
    if f.spec:
        dc = draft_cells(f, d)
        comps += [
            Component("drafter_weights", "drafter weights", w.drafter_gpu, "shares the target's embeddings and head"),
            Component("drafter_kv", "drafter KV cache", drafter_kv(d, f),
                      f"{d.num_hidden_layers} layers x {dc} cells, {f.draft_cache_type}"
                      + (f" (-cd {f.draft_ctx} window)" if f.draft_ctx else
                         f" (its {d.sliding_window}-token window)" if d.sliding_window else "")),
            Component("drafter_compute", "drafter compute buffer", drafter_compute(t, d, f),
                      f"-ub {f.ubatch} x vocab logits"),
            Component("features", "drafter's target features", features(t, d, f),
                      f"{len(d.target_layer_ids)} target layers x {feature_rows(d, f)} verify rows, f32"),
        ]
    if cuda:
        overhead = (CUDA_CONTEXT_MIB + (DRAFT_CONTEXT_MIB if f.spec else 0)) * MIB
        comps.append(Component("cuda_overhead", "CUDA context + workspaces", overhead, "calibrated (H200)"))
    return Prediction(f, comps, w.source, cuda)


def tree_extra(recipe: Recipe, flags: FitFlags, scale: str = "full", weights: Weights | None = None) -> dict[str, int]:
    """What the tree costs over the chain with the same flags, by component (those that grow)."""
    tree = predict(recipe, flags, scale, weights)
    chain = predict(recipe, replace(flags, tree_budget=0), scale, weights)
    return {c.key: c.bytes - chain.get(c.key) for c in tree.components if c.bytes != chain.get(c.key)}


def fits(p: Prediction, gpu_gib: float, margin_gib: float) -> bool:
    return p.total + margin_gib * GIB <= gpu_gib * GIB


def max_context(recipe: Recipe, flags: FitFlags, gpu_gib: float, margin_gib: float = 0.25, scale: str = "full",
                weights: Weights | None = None) -> int:
    """The largest -c (a multiple of 256, up to the trained context) that fits; 0 if none does.
    A draft context of its own (-cd) stays fixed; otherwise it follows -c."""
    t = recipe.geometry_at(scale).target
    weights = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    lo, hi = 0, t.max_position_embeddings // CELL_PAD
    while lo < hi:  # memory grows with the context: binary search on multiples of 256
        mid = (lo + hi + 1) // 2
        p = predict(recipe, replace(flags, ctx=mid * CELL_PAD), scale, weights)
        lo, hi = (mid, hi) if fits(p, gpu_gib, margin_gib) else (lo, mid - 1)
    return lo * CELL_PAD


@dataclass
class Knob:
    change: str
    flags: FitFlags
    total_bytes: int
    max_ctx: int


def knobs(recipe: Recipe, flags: FitFlags, gpu_gib: float, margin_gib: float, scale: str = "full",
          weights: Weights | None = None) -> list[Knob]:
    """The configured flags and the usual ways to trade memory: KV cache type, draft length, AR."""
    weights = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    options = [("as configured", flags)]
    for kv in ("q8_0", "q4_0"):
        if flags.cache_type_k != kv:
            options.append((f"KV cache {kv} (-ctk {kv} -ctv {kv})", replace(flags, cache_type_k=kv, cache_type_v=kv)))
    draft_max = spelling(recipe, "--draft-max")
    for n in (8, 4):
        if flags.spec and flags.draft_max > n:
            options.append((f"draft length {n} ({draft_max} {n})", replace(flags, draft_max=n)))
    if flags.tree:
        options.append(("the chain (--tree-budget 0)", replace(flags, tree_budget=0)))
    if flags.spec:
        options.append(("no drafter (AR)", replace(flags, draft_max=0)))
    out = []
    for change, f in options:
        total = predict(recipe, f, scale, weights).total
        out.append(Knob(change, f, total, max_context(recipe, f, gpu_gib, margin_gib, scale, weights)))
    return out


def spelling(recipe: Recipe, option: str) -> str:
    """The flag a suggestion names for `option`: as the recipe spells it (the user copies it next to
    the recipe's flags, and the README's), else `option` itself."""
    return next((str(n) for n in recipe.server_flags if command.canonical(str(n)) == command.canonical(option)),
                option)


# --- slots -----------------------------------------------------------------------------------
# -c is the whole context: llama-server gives each of -np slots its share (its KV cells, and a
# recurrent state, tape and drafter window of its own), so "context per slot" is -c / N.

def _fits_per_slot(recipe: Recipe, f: FitFlags, n: int, ctx_per_slot: int, gpu_gib: float, margin_gib: float,
                   scale: str, weights: Weights) -> bool:
    return fits(predict(recipe, replace(with_slots(recipe, f, n), ctx=ctx_per_slot * n), scale, weights),
                gpu_gib, margin_gib)


def max_context_per_slot(recipe: Recipe, f: FitFlags, n: int, gpu_gib: float, margin_gib: float = MARGIN_GIB,
                         scale: str = "full", weights: Weights | None = None) -> int:
    """The largest context each of n slots can have (a multiple of 256); 0 if none fits."""
    t = recipe.geometry_at(scale).target
    weights = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    lo, hi = 0, t.max_position_embeddings // CELL_PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok = _fits_per_slot(recipe, f, n, mid * CELL_PAD, gpu_gib, margin_gib, scale, weights)
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    return lo * CELL_PAD


def max_slots(recipe: Recipe, f: FitFlags, gpu_gib: float, margin_gib: float, ctx_per_slot: int,
              scale: str = "full", weights: Weights | None = None) -> int:
    """How many slots of ctx_per_slot tokens each fit (up to MAX_SLOTS); 0 if not even one."""
    weights = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    fitting = [n for n in range(1, MAX_SLOTS + 1)
               if _fits_per_slot(recipe, f, n, ctx_per_slot, gpu_gib, margin_gib, scale, weights)]
    return max(fitting, default=0)


@dataclass(frozen=True)
class SlotPlan:
    slots: int
    ctx_per_slot: int  # the largest context each slot can have
    ubatch: int  # -ub for this many slots (with_slots)

    @property
    def ctx(self) -> int:
        """llama-server's -c for it."""
        return self.ctx_per_slot * self.slots


def slot_plans(recipe: Recipe, f: FitFlags, gpu_gib: float, margin_gib: float = MARGIN_GIB, scale: str = "full",
               weights: Weights | None = None) -> list[SlotPlan]:
    """For 1 to MAX_SLOTS slots, the largest context each can have."""
    weights = weights or weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    f = replace(f, tree_budget=0)  # several slots verify chains
    return [SlotPlan(n, max_context_per_slot(recipe, f, n, gpu_gib, margin_gib, scale, weights),
                     with_slots(recipe, f, n).ubatch) for n in range(1, MAX_SLOTS + 1)]


def slot_cost(recipe: Recipe, f: FitFlags, ctx_per_slot: int, scale: str = "full",
              weights: Weights | None = None) -> dict[str, int]:
    """What one more slot adds to f's slots at ctx_per_slot tokens each, by component (bytes; only
    the components that grow): its KV cells, its recurrent state, tape and drafter window, and,
    where the ubatch must grow for it, the compute buffers."""
    n = f.n_parallel
    now = predict(recipe, replace(with_slots(recipe, f, n), ctx=ctx_per_slot * n), scale, weights)
    more = predict(recipe, replace(with_slots(recipe, f, n + 1), ctx=ctx_per_slot * (n + 1)), scale, weights)
    return {c.key: c.bytes - now.get(c.key) for c in more.components if c.bytes != now.get(c.key)}
