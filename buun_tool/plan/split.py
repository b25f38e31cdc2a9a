"""The layer split of one server over several GPUs of one host (`buun serve --gpus 0,1`,
`buun fit --gpu-mem 24,24`): which target layers each card holds, its memory, the largest context.

    layer_devices(proportions, n_layer)            -> the card of each layer, by llama.cpp's rule
    plan(recipe, flags, cards, draft, weights)     -> Split: per card its layers and memory, and -ts
    max_context(recipe, flags, cards, draft, ...)  -> the largest -c that some split fits

llama.cpp's `-sm layer` with `-ts P0,P1,...` and every layer offloaded (llama_model_base::
load_tensors): the n_layer blocks and the output layer (output.weight and output_norm, index
n_layer) are n_layer + 1 "layers"; layer i goes to the first card whose cumulative share of the
proportions exceeds i / (n_layer + 1). token_embd stays in host memory. So `-ts` given as layer
counts summing to n_layer + 1 puts exactly that many layers on each card, in the order of -dev,
and the output layer on the last one.

Each card holds its layers' weights, KV cache (full-attention layers) and recurrent state and tape
(delta-net layers), a compute buffer (a layer's activations on every card, the verify's logits on
the output layer's) and a CUDA context. With several cards llama.cpp pipelines the layers
(`pipeline parallelism enabled`): the scheduler keeps PIPELINE_COPIES copies of each graph input,
the KQ mask and the hidden rows that cross cards, on every card. The drafter's card adds the
drafter (weights, KV, compute), the target features it reads (counted on its card; a few MiB) and
the draft context's overhead. A drafter off the output layer's card (--draft-gpu) borrows an
lm_head that lives elsewhere: where its logits are computed then is llama.cpp's to settle, and the
plan keeps them on the drafter's card. The per-card terms beyond the one-card calibration (a CUDA
context per card, the input copies) are llama.cpp's rules; on two H200s the cards held 3.0% and
3.7% less than the plan at 131072 tokens (docs/performance.md). `buun fit --gpus 0,1 --measure`
compares them with what the cards hold.

Within those rules the split leaves every card the same free memory, as far as whole layers
allow: the drafter's card gets fewer target layers.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from buun_tool.base import nvidia
from buun_tool.base.errors import UsageError
from buun_tool.formats.recipes import Recipe
from buun_tool.plan import fit

PIPELINE_COPIES = 4  # GGML_SCHED_MAX_COPIES: the scheduler's copies of each input when it pipelines


@dataclass(frozen=True)
class Card:
    """One GPU of the split: its memory, and nvidia-smi's index and name where known."""

    gib: float
    index: int
    name: str = ""

    def label(self) -> str:
        return f"GPU{self.index}" + (f" ({self.name})" if self.name else "")

    @classmethod
    def of(cls, gpu: nvidia.Gpu) -> Card:
        """A card as nvidia-smi describes it."""
        return cls(gpu.memory_mib / 1024, gpu.index, gpu.name)


def cards_from_gib(sizes: Sequence[float]) -> list[Card]:
    """`--gpu-mem 24,24`: cards numbered in order."""
    return [Card(g, i) for i, g in enumerate(sizes)]


def layer_devices(proportions: Sequence[float], n_layer: int) -> list[int]:
    """The card (position in -dev) of each of the n_layer + 1 layers, the last being the output
    layer, for -ts proportions: llama.cpp's float arithmetic, step for step (float32 sums and
    divisions, std::upper_bound)."""
    if not proportions or any(p < 0 for p in proportions) or sum(proportions) <= 0:
        raise UsageError(f"-ts {','.join(f'{p:g}' for p in proportions)}: expected proportions >= 0, "
                         "not all 0", "give one number per card, such as -ts 33,32")
    total = np.float32(0)
    cum = []
    for p in proportions:
        total = np.float32(total + np.float32(p))
        cum.append(total)
    splits = [float(np.float32(c / total)) for c in cum]
    n = n_layer + 1
    return [min(bisect_right(splits, float(np.float32(np.float32(i) / np.float32(n)))), len(splits) - 1)
            for i in range(n)]


def counts_of(devices: Sequence[int], n_cards: int) -> list[int]:
    return [sum(1 for d in devices if d == c) for c in range(n_cards)]


# --- the memory of each card -----------------------------------------------------------------

@dataclass(frozen=True)
class _Parts:
    """Per layer (n_layer + 1, the output layer last): weights, KV share, recurrent share; and
    each card's bytes that do not depend on its layers, but for the compute buffer, which is
    larger on the card of the output layer (the verify's logits)."""

    weights: list[int]
    kv: list[float]
    recurrent: list[float]
    fixed: list[dict[str, int]]
    compute: int  # a card's compute buffer
    compute_output: int  # the output layer's card's

    def item(self, i: int) -> float:
        return self.weights[i] + self.kv[i] + self.recurrent[i]

    def card(self, c: int, output: bool) -> dict[str, int]:
        return {**self.fixed[c], "target_compute": self.compute_output if output else self.compute}


def _parts(recipe: Recipe, f: fit.FitFlags, n_cards: int, draft: int, weights: fit.Weights,
           scale: str) -> _Parts:
    geo = recipe.geometry_at(scale)
    t, d = geo.target, geo.drafter
    n_layer = len(weights.layers) or t.num_hidden_layers
    w = list(weights.layers) or [(weights.target_gpu - weights.output) // n_layer] * n_layer
    n_attn = t.n_full_attention
    n_rec = t.num_hidden_layers - n_attn
    kv_each = fit.target_kv(t, f) / n_attn if n_attn else 0.0
    rs_each = fit.recurrent(t, f) / n_rec if n_rec else 0.0
    # blocks beyond the geometry's (a GGUF's NextN layers) hold weights only
    attn = [i < t.num_hidden_layers and t.is_full_attention(i) for i in range(n_layer)]
    rec = [i < t.num_hidden_layers and not t.is_full_attention(i) for i in range(n_layer)]
    act, logits, mask = fit.target_compute_parts(t, f, cuda=True)
    copies = PIPELINE_COPIES if n_cards > 1 else 1
    inputs = (mask + (t.hidden_size * min(f.ubatch, f.batch) * 4 if n_cards > 1 else 0)) * copies
    fixed = []
    for c in range(n_cards):
        parts = {"cuda_overhead": fit.CUDA_CONTEXT_MIB * fit.MIB}
        if f.spec and c == draft:
            parts.update(drafter_weights=weights.drafter_gpu, drafter_kv=fit.drafter_kv(d, f),
                         drafter_compute=fit.drafter_compute(t, d, f), features=fit.features(t, d, f))
            parts["cuda_overhead"] += fit.DRAFT_CONTEXT_MIB * fit.MIB
        fixed.append(parts)
    return _Parts(w + [weights.output], [kv_each if a else 0.0 for a in attn] + [0.0],
                  [rs_each if r else 0.0 for r in rec] + [0.0], fixed, act + inputs, max(act, logits) + inputs)


@dataclass(frozen=True)
class CardPlan:
    position: int  # its device under CUDA_VISIBLE_DEVICES: CUDA<position>
    card: Card
    first: int  # its first layer
    count: int  # its layers, the output layer counted as one
    n_layer: int
    drafter: bool
    components: dict[str, int]  # bytes by fit's component keys

    @property
    def device(self) -> str:
        return f"CUDA{self.position}"

    @property
    def output(self) -> bool:
        return self.count > 0 and self.first + self.count == self.n_layer + 1

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def free(self) -> float:
        return self.card.gib * fit.GIB - self.total

    def layers(self) -> str:
        """`0-32`, `33-63 + output`, `-` (none)."""
        blocks = self.count - (1 if self.output else 0)
        text = (f"{self.first}-{self.first + blocks - 1}" if blocks > 1 else str(self.first)) if blocks else ""
        return (f"{text} + output" if text else "output") if self.output else (text or "-")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.card.index, "name": self.card.name, "device": self.device, "gib": self.card.gib,
                "first_layer": self.first, "layers": self.count, "range": self.layers(), "output": self.output,
                "drafter": self.drafter, "components": self.components, "total_bytes": self.total,
                "total_gib": self.total / fit.GIB}


@dataclass(frozen=True)
class Split:
    flags: fit.FitFlags
    n_layer: int
    cards: list[CardPlan]
    margin_gib: float

    @property
    def counts(self) -> list[int]:
        return [c.count for c in self.cards]

    @property
    def ts(self) -> str:
        """llama-server's -ts: the layer counts, which llama.cpp's rule turns back into the same counts."""
        return ",".join(str(n) for n in self.counts)

    @property
    def draft(self) -> CardPlan:
        return next(c for c in self.cards if c.drafter) if self.flags.spec else self.cards[-1]

    @property
    def fits(self) -> bool:
        return all(c.free >= self.margin_gib * fit.GIB for c in self.cards)

    @property
    def total(self) -> int:
        return sum(c.total for c in self.cards)

    def describe(self) -> str:
        """`layers 0-32 on GPU0, 33-63 + output on GPU1; drafter on GPU1`."""
        where = ", ".join(f"{c.layers()} on GPU{c.card.index}" for c in self.cards)
        return f"layers {where}" + (f"; drafter on GPU{self.draft.card.index}" if self.flags.spec else "")

    def to_json(self) -> dict[str, Any]:
        return {"ctx": self.flags.ctx, "n_layer": self.n_layer, "ts": self.ts, "fits": self.fits,
                "margin_gib": self.margin_gib, "total_bytes": self.total,
                "draft_gpu": self.draft.card.index if self.flags.spec else None,
                "cards": [c.to_json() for c in self.cards]}


def _assign(p: _Parts, caps: Sequence[float]) -> list[int] | None:
    """Layer counts, in order, each card at least one layer and within its capacity (bytes): each
    card takes as many as fit before the next (for a contiguous split, the most any split can
    leave to the cards after it); None if none fits."""
    n_items = len(p.weights)
    counts: list[int] = []
    i = 0
    for c, cap in enumerate(caps):
        last = c == len(caps) - 1
        used = float(sum(p.card(c, last).values()))
        k = 0
        while i + k < n_items and (last or i + k < n_items - (len(caps) - c - 1)):
            if not last and used + p.item(i + k) > cap:
                break
            used += p.item(i + k)
            k += 1
        if k == 0 or used > cap:
            return None
        counts.append(k)
        i += k
    return counts


def _balanced(p: _Parts, cards: Sequence[Card], margin_gib: float) -> list[int] | None:
    """The counts that leave the most free memory on the fullest card (a binary search on the
    headroom every card keeps); None when even margin_gib cannot be kept on each."""
    sizes = [c.gib * fit.GIB for c in cards]
    lo, hi = margin_gib * fit.GIB, max(sizes)
    best = _assign(p, [s - lo for s in sizes])
    if best is None:
        return None
    for _ in range(40):  # to well under a byte of a 24 GiB card's headroom
        mid = (lo + hi) / 2
        found = _assign(p, [s - mid for s in sizes])
        lo, hi, best = (mid, hi, found) if found else (lo, mid, best)
    return best


def _proportional(p: _Parts, cards: Sequence[Card]) -> list[int]:
    """Counts by card memory (largest remainder), each at least one: the split shown when none fits."""
    n_items, total = len(p.weights), sum(c.gib for c in cards)
    raw = [c.gib / total * n_items for c in cards]
    counts = [max(1, int(r)) for r in raw]
    for i in sorted(range(len(cards)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if sum(counts) >= n_items:
            break
        counts[i] += 1
    while sum(counts) > n_items:
        counts[counts.index(max(counts))] -= 1
    return counts


def _check(cards: Sequence[Card], draft: int, n_layer: int) -> None:
    if not cards:
        raise UsageError("a split needs at least one card", "pass --gpus 0,1 (or --gpu-mem 24,24)")
    if not 0 <= draft < len(cards):
        raise UsageError(f"the drafter's card {draft} is not one of the {len(cards)} cards of the split")
    if len(cards) > n_layer + 1:
        raise UsageError(f"{len(cards)} cards for {n_layer + 1} layers: each card of a split holds at least one",
                         "list fewer cards")


def _plan_of(recipe: Recipe, f: fit.FitFlags, cards: Sequence[Card], draft: int, p: _Parts,
             counts: Sequence[int], margin_gib: float) -> Split:
    n_layer = len(p.weights) - 1
    out, first = [], 0
    for c, (card, n) in enumerate(zip(cards, counts, strict=True)):
        span = range(first, first + n)
        comps = {"target_weights": sum(p.weights[i] for i in span),
                 "target_kv": int(sum(p.kv[i] for i in span) + 0.5),
                 "recurrent": int(sum(p.recurrent[i] for i in span) + 0.5),
                 **p.card(c, n_layer in span)}
        out.append(CardPlan(c, card, first, n, n_layer, f.spec and c == draft, comps))
        first += n
    return Split(f, n_layer, out, margin_gib)


def plan(recipe: Recipe, flags: fit.FitFlags, cards: Sequence[Card], draft: int | None = None,
         weights: fit.Weights | None = None, margin_gib: float = fit.MARGIN_GIB, scale: str = "full",
         proportions: Sequence[float] | None = None) -> Split:
    """The split of `flags` over `cards` (in -dev order), the drafter on card `draft` (a position;
    default the last, which holds the output layer): the balanced one, or where given, what
    llama.cpp makes of the user's -ts `proportions`. A split that fits nowhere is shown by card
    memory, its `fits` false."""
    weights = weights or fit.weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    draft = len(cards) - 1 if draft is None else draft
    p = _parts(recipe, flags, len(cards), draft, weights, scale)
    _check(cards, draft, len(p.weights) - 1)
    if proportions is not None:
        if len(proportions) != len(cards):
            raise UsageError(f"-ts gives {len(proportions)} proportions for {len(cards)} cards",
                             "give one number per card of --gpus")
        counts = counts_of(layer_devices(proportions, len(p.weights) - 1), len(cards))
    else:
        counts = _balanced(p, cards, margin_gib) or _proportional(p, cards)
    return _plan_of(recipe, flags, cards, draft, p, counts, margin_gib)


def max_context(recipe: Recipe, flags: fit.FitFlags, cards: Sequence[Card], draft: int | None = None,
                weights: fit.Weights | None = None, margin_gib: float = fit.MARGIN_GIB, scale: str = "full") -> int:
    """The largest -c (a multiple of 256, up to the trained context) for which some split of the
    layers keeps margin_gib free on every card; 0 if none does."""
    t = recipe.geometry_at(scale).target
    weights = weights or fit.weights_from_plan(recipe, scale, "q4_k_m", "q4_k")
    draft = len(cards) - 1 if draft is None else draft
    caps = [c.gib * fit.GIB - margin_gib * fit.GIB for c in cards]

    def fits_at(ctx: int) -> bool:
        return _assign(_parts(recipe, replace(flags, ctx=ctx), len(cards), draft, weights, scale), caps) is not None

    _check(cards, draft, len(weights.layers) or t.num_hidden_layers)
    lo, hi = 0, t.max_position_embeddings // fit.CELL_PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits_at(mid * fit.CELL_PAD) else (lo, mid - 1)
    return lo * fit.CELL_PAD
