"""The VRAM fit planner: GPU memory of a target + DFlash drafter server, by component.

    predict(recipe, FitFlags(ctx=6048, draft_max=15)) -> Prediction
    max_context(recipe, flags, gpu_gib)               -> the largest -c that fits
    slot_plans(recipe, flags, gpu_gib, margin)        -> per number of slots, the largest context each
    max_slots(recipe, flags, gpu_gib, margin, ctx)    -> how many slots of ctx tokens fit
    measure(recipe, flags)                            -> what the real llama-server allocates

(split.py lays these components over the cards of a layer split: `buun fit --gpu-mem 24,24`.)

What llama-server allocates on the GPU with every layer offloaded (-ngl 99 -ngld 99, flash
attention on), following the pinned upstream's allocations:

- weights: every tensor but token_embd, which llama.cpp keeps in host memory; the drafter
  borrows the target's embeddings and lm_head. From the GGUFs when present, else from the
  recipe geometry and the quant types (the exact tensor list `buun synth` writes).
- KV cache of the full-attention layers only: pad256(ctx) cells x K and V rows, by cache type.
- recurrent state of the Gated DeltaNet layers, f32: the delta-net state (state_size x
  value_dim) and the conv window ((kernel - 1) x conv_dim) per sequence. With a drafter, patch
  0011's tape-replay rollback keeps 1 plane and a tape of n_rs_seq + 1 tokens (conv inputs, gate
  and beta per delta-net layer), n_rs_seq being the unclamped --spec-draft-n-max, or the tree
  budget where that is larger (patch 0022 raises it so that the tape holds a tree's verify);
  upstream's snapshot rollback (LLAMA_RS_ROLLBACK=snapshot) keeps 1 + n_rs_seq planes.
- the drafter's KV cache at its own context (-cd) or the target's.
- the drafter's features: patch 0014 keeps the target's tapped layers of a verify on the device,
  n_embd x taps x rows f32, rows the block size or a tree's verify where that is wider, one such
  verify per slot up to the ubatch (patch 0014: the slots verify in one batch).
- compute buffers: formulas fitted to llama-server's reported sizes (CPU build, full and tiny
  synthetic models, several ubatch, context and n_max values; see _target_compute), the target's
  activations scaled for CUDA (H200 readings). A tree verifies budget + 1 tokens in one ubatch:
  its logits rows widen the target's buffer.
- the CUDA context, cuBLAS and pool workspaces: calibrated on an H200 with the pinned upstream
  (nvidia-smi after load: 16.3 GiB AR, 19.7 GiB DFlash at -c 6048 -np 1, n_max 15).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command
from buun_tool.base.errors import UsageError
from buun_tool.formats import gguf_tools, layout, model_plan
from buun_tool.formats.recipes import MAX_SLOTS, DrafterGeometry, Recipe, TargetGeometry

MIB = 2**20
GIB = 2**30
CELL_PAD = 256  # llama_context pads n_ctx (and n_ctx_seq) to a multiple of 256
# bytes per element of each KV cache type (block bytes / block size)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
# Calibration (H200, CUDA 12, pinned upstream): what nvidia-smi showed beyond llama.cpp's own
# buffers as predicted here, for the process and for the extra draft context. The readings were
# given to 0.1 GiB, so each is good to about +-50 MiB.
CUDA_CONTEXT_MIB = 936
DRAFT_CONTEXT_MIB = 145
FIT = "fit"  # a recipe's `-c: fit`: the largest context that fits the GPU found at launch
MARGIN_GIB = 0.25  # kept free on the GPU (display, fragmentation), here and in `buun fit`
# llama-server's spellings of the tree budget (patch 0022)
TREE_BUDGET_FLAGS = ("--spec-tree-budget", "--tree-budget", "--ddtree-budget")
TREE_BUDGET_HINT = "0 (or 1) verifies the chain; 22 verifies a tree of 22 draft tokens (docs/tree.md)"


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
        return self.spec and self.tree_budget > 1

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


def check_tree_budget(n: int, option: str) -> int:
    """A tree budget as given on a command line: a whole number of draft nodes, 0 or more."""
    if n < 0:
        raise UsageError(f"{option} {n}: expected 0 or more draft nodes", TREE_BUDGET_HINT)
    return n


def check_tree(f: FitFlags) -> None:
    """A tree is decoded in one ubatch (patch 0021 asserts it): budget + 1 tokens must fit -ub."""
    ub = min(f.ubatch, f.batch)
    width = f.tree_budget + 1
    if f.tree and width > ub:
        raise UsageError(f"a tree budget of {f.tree_budget} verifies {width} tokens in one ubatch, more than -ub {ub}",
                         f"pass a budget of at most {ub - 1}, or a larger ubatch (`-- -ub {width} "
                         f"-b {max(f.batch, width)}`)")


# --- weights ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Weights:
    target_gpu: int
    target_host: int  # token_embd stays in host memory
    drafter_gpu: int
    source: str
    # the target's GPU bytes by block (blk.N.*, as many as the GGUF's block_count) and of the output
    # layer (output.weight, output_norm): what a layer split (split.py) puts on each card
    layers: tuple[int, ...] = ()
    output: int = 0


def _split(tensors: list[tuple[str, int]]) -> tuple[int, int]:
    host = sum(n for name, n in tensors if name == "token_embd.weight")
    return sum(n for _, n in tensors) - host, host


_BLOCK = re.compile(r"blk\.(\d+)\.")


def _by_layer(tensors: list[tuple[str, int]]) -> tuple[tuple[int, ...], int]:
    """(bytes of each block, bytes of the rest but token_embd: the output layer)."""
    blocks: dict[int, int] = {}
    output = 0
    for name, n in tensors:
        m = _BLOCK.match(name)
        if m:
            blocks[int(m.group(1))] = blocks.get(int(m.group(1)), 0) + n
        elif name != "token_embd.weight":
            output += n
    return tuple(blocks.get(i, 0) for i in range(max(blocks, default=-1) + 1)), output


def _target_weights(tensors: list[tuple[str, int]], drafter_gpu: int, source: str) -> Weights:
    tgpu, thost = _split(tensors)
    layers, output = _by_layer(tensors)
    return Weights(tgpu, thost, drafter_gpu, source, layers, output)


def weights_from_plan(recipe: Recipe, scale: str, target_type: str, draft_type: str) -> Weights:
    pair = model_plan.plan_pair(recipe, scale, target_type, draft_type)
    dgpu, _ = _split([(t.name, t.nbytes) for t in pair.drafter.tensors])
    return _target_weights([(t.name, t.nbytes) for t in pair.target.tensors], dgpu,
                           f"geometry ({scale}) x {target_type} / {draft_type}")


def _gguf_tensors(path: Path) -> list[tuple[str, int]]:
    st = path.stat()
    return list(_read_tensors(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _read_tensors(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    """A GGUF's tensors, read once per file as it is. buun's own reader checks the header (a file
    from the Hub is anyone's: gguf-py's reader raised bare ValueErrors, or hung on a nested
    array) and skips the vocabulary, which gguf-py parses whole (seconds)."""
    del size, mtime_ns  # the cache key: a changed file is read again
    with gguf_tools.GgufFile(Path(path)) as f:
        return tuple((t.name, t.nbytes) for t in f.tensors)


def default_weights(recipe: Recipe, models_dir: Path, target_type: str | None = None,
                    draft_type: str = "q4_k") -> Weights:
    """The pulled GGUFs' tensors when both are in `models_dir`, else the recipe geometry at its quant."""

    lay = layout.for_recipe(recipe, models_dir)
    drafter = lay.drafter_gguf()
    if target_type is None and lay.target_gguf.is_file() and drafter.is_file():
        return weights_from_files(lay.target_gguf, drafter)
    quant = (target_type or recipe.quantize).lower()
    return weights_from_plan(recipe, "full", quant if quant in model_plan.TARGET_TYPES else "q4_k_m", draft_type)


def weights_from_files(target: Path, drafter: Path | None) -> Weights:
    dgpu = _split(_gguf_tensors(drafter))[0] if drafter else 0
    names = target.name + (f" + {drafter.name}" if drafter else "")
    return _target_weights(_gguf_tensors(target), dgpu, f"GGUF files ({names})")


# --- the other components --------------------------------------------------------------------

def _pad(n: int) -> int:
    return -(-n // CELL_PAD) * CELL_PAD


def cells(ctx: int, n_parallel: int) -> int:
    """KV cells llama.cpp allocates: n_ctx padded to 256, split per sequence, each share padded again."""
    return _pad(_pad(ctx) // n_parallel) * n_parallel


def kv_type_bytes(name: str) -> float:
    if name not in KV_TYPE_BYTES:
        raise UsageError(f"unknown KV cache type {name!r}", f"valid: {', '.join(KV_TYPE_BYTES)}")
    return KV_TYPE_BYTES[name]


def target_kv(t: TargetGeometry, f: FitFlags) -> int:
    row = t.num_key_value_heads * t.head_dim
    per_cell = row * (kv_type_bytes(f.cache_type_k) + kv_type_bytes(f.cache_type_v))
    return int(t.n_full_attention * cells(f.ctx, f.n_parallel) * per_cell)


def recurrent_plane(t: TargetGeometry) -> int:
    """One sequence's f32 recurrent state over all delta-net layers: conv window + delta state."""
    conv = (t.linear_conv_kernel_dim - 1) * t.conv_dim
    state = t.linear_key_head_dim * t.value_dim
    return (t.num_hidden_layers - t.n_full_attention) * (conv + state) * 4


def recurrent_planes(f: FitFlags) -> int:
    if not f.spec:
        return 1
    return 1 if f.rollback == "tape" else 1 + f.rs_rows  # the tape: one plane since patch 0011


def recurrent_tape(t: TargetGeometry, f: FitFlags) -> int:
    """Patch 0011's tape for one verify of n_rs_seq + 1 tokens (a tree's budget + 1 where that is
    wider): per delta-net layer and token the conv inputs, the gate and beta (f32), and per layer a
    zero row of each (what a replay reads past the accepted count; the conv inputs' since 0021)."""
    if not f.spec or f.rollback != "tape":
        return 0
    return (f.n_parallel * f.verify_width + 1) * tape_row(t)


def tape_row(t: TargetGeometry) -> int:
    """One token's row of the tape over all delta-net layers: conv inputs, gate and beta, f32."""
    per_token = t.conv_dim + 2 * t.linear_num_value_heads
    return per_token * (t.num_hidden_layers - t.n_full_attention) * 4


def recurrent(t: TargetGeometry, f: FitFlags) -> int:
    return f.n_parallel * recurrent_planes(f) * recurrent_plane(t) + recurrent_tape(t, f)


def draft_cells(f: FitFlags) -> int:
    """The drafter's KV cells: the target's, or with -cd N a sliding-window cache of
    pad256(min(cells, N + ubatch)) per sequence (llama_kv_cache_iswa)."""
    full = cells(f.ctx, f.n_parallel)
    if not f.draft_ctx:
        return full
    per_seq = full // f.n_parallel
    return _pad(min(per_seq, f.draft_ctx + min(f.ubatch, f.batch))) * f.n_parallel


def drafter_kv(d: DrafterGeometry, f: FitFlags) -> int:
    if not f.spec:
        return 0
    row = d.num_key_value_heads * d.head_dim
    return int(d.num_hidden_layers * draft_cells(f) * row * 2 * kv_type_bytes(f.draft_cache_type))


# A CUDA build's target compute buffer holds less of a layer's activations than the CPU build's:
# AR at -ub 64 (full scale, H200) held 16.0 MiB, 0.75 of it the mask, where the CPU fit says 17.0
# for the activations. So on CUDA the chain's 16 logits rows (15.2 MiB) weigh about as much, and a
# tree's extra rows add in full (budget 22: +6.77 MiB measured, +6.54 predicted with this factor).
CUDA_ACTIVATIONS = 15.25 / 17.0


def _target_compute(t: TargetGeometry, f: FitFlags, cuda: bool = False) -> int:
    """Peak of the target's graph. Fitted to llama-server's CPU compute buffers (full scale:
    AR 17.25 / 138.0 MiB at -ub 64 / 512, DFlash n_max 4/8/15 at -ub 64: 29.2 / 41.2 / 62.2 MiB;
    tiny scale likewise, within ~15%): per ubatch token about 4 f32 rows of the FFN width (or
    ~6 of the delta-net value width), one delta-net state per layer for each rollback plane the
    graph writes (none with the tape), or the logits of the verified rows, whichever is larger;
    plus the f16 KQ mask. On CUDA the activations are CUDA_ACTIVATIONS of that (H200: the chain,
    a budget-22 tree, 1, 2 and 4 slots and 131072 tokens within 4.3%)."""
    activations, logits, mask = target_compute_parts(t, f, cuda)
    return max(activations, logits) + mask


def target_compute_parts(t: TargetGeometry, f: FitFlags, cuda: bool = False) -> tuple[int, int, int]:
    """_target_compute's terms: (a layer's activations and rollback states, the verify's logits,
    the KQ mask). A layer split holds the first on every card, the logits on the output layer's
    and the mask, a graph input, on each card (split.py). The logits are one ubatch's rows: the
    slots' verify blocks, up to -ub of them (4 slots of 17 rows at -ub 64 hold 64)."""
    ub = min(f.ubatch, f.batch)
    per_token = 4 * max(4 * t.intermediate_size, int(5.67 * t.value_dim))
    activations = int(ub * per_token * (CUDA_ACTIVATIONS if cuda else 1.0))
    n_rs = f.rs_rows if f.spec and f.rollback == "snapshot" else 0
    states = n_rs * t.linear_key_head_dim * t.value_dim * 4
    logits = min(f.verify_width * f.n_parallel, ub) * t.vocab_size * 4
    mask = ub * cells(f.ctx, f.n_parallel) * 2
    return activations + states, logits, mask


def feature_rows(d: DrafterGeometry, f: FitFlags) -> int:
    """Verify rows whose tapped layers patch 0014 keeps on the device: a block, or a wider tree,
    for each slot as far as one ubatch goes (patch 0014)."""
    if not f.spec:
        return 0
    # as llama-server sizes it: the drafter's block (not --draft-max, which it clamps), or a tree's
    per_slot = max(d.block_size, f.tree_budget + 1 if f.tree else 0)
    return max(per_slot, min(per_slot * f.n_parallel, min(f.ubatch, f.batch)))


def features(t: TargetGeometry, d: DrafterGeometry, f: FitFlags) -> int:
    return t.hidden_size * len(d.target_layer_ids) * feature_rows(d, f) * 4


def drafter_compute(t: TargetGeometry, d: DrafterGeometry, f: FitFlags) -> int:
    """The drafter's graph holds logits and a hidden row for a whole ubatch, ub x (vocab + hidden)
    f32. It is reserved again with the on-device top-k sampler, which runs once over the rows
    (patch 0019) and adds little; run once per row, as upstream, it doubled the buffer (CPU build:
    123.45 MiB full scale, 122.26 MiB tiny, at -ub 64, before 0019)."""
    if not f.spec:
        return 0
    return min(f.ubatch, f.batch) * (t.vocab_size + d.hidden_size) * 4


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
        Component("target_compute", "target compute buffer", _target_compute(t, f, cuda), f"-ub {f.ubatch}"),
    ]
    if f.spec:
        dc = draft_cells(f)
        comps += [
            Component("drafter_weights", "drafter weights", w.drafter_gpu, "shares the target's embeddings and head"),
            Component("drafter_kv", "drafter KV cache", drafter_kv(d, f),
                      f"{d.num_hidden_layers} layers x {dc} cells, {f.draft_cache_type}"
                      + (f" (-cd {f.draft_ctx} window)" if f.draft_ctx else "")),
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
