"""The memory terms of a launch: what llama-server allocates on the GPU, by component, for the
settings in FitFlags (flags.py), with every layer offloaded (-ngl 99 -ngld 99, flash attention
on), following the pinned upstream's allocations (the weights: weights.py):

- KV cache of the full-attention layers only: pad256(ctx) cells x K and V rows, by cache type.
- recurrent state of the Gated DeltaNet layers, f32: the delta-net state (state_size x
  value_dim) and the conv window ((kernel - 1) x conv_dim) per sequence. With a drafter, patch
  0011's tape-replay rollback keeps 1 plane and a tape of n_rs_seq + 1 tokens (conv inputs, gate
  and beta per delta-net layer), n_rs_seq being the unclamped --spec-draft-n-max, or the tree
  budget where that is larger (patch 0023 raises it so that the tape holds a tree's verify);
  upstream's snapshot rollback (LLAMA_RS_ROLLBACK=snapshot) keeps 1 + n_rs_seq planes.
- the drafter's KV cache at its own context (-cd) or the target's.
- the drafter's features: patch 0014 keeps the target's tapped layers of a verify on the device,
  n_embd x taps x rows f32, rows the block size or a tree's verify where that is wider, one such
  verify per slot up to the ubatch (patch 0014: the slots verify in one batch).
- compute buffers: formulas fitted to llama-server's reported sizes (CPU build, full and tiny
  synthetic models, several ubatch, context and n_max values; see target_compute), the target's
  activations scaled for CUDA (H200 readings). A tree verifies budget + 1 tokens in one ubatch:
  its logits rows widen the target's buffer.
- the CUDA context, cuBLAS and pool workspaces: calibrated on an H200 with the pinned upstream
  (nvidia-smi after load: 16.3 GiB AR, 19.7 GiB DFlash at -c 6048 -np 1, n_max 15).

fit.py adds them up into a prediction; split.py lays them over the cards of a layer split.
"""

from __future__ import annotations

from buun_tool.base.errors import UsageError
from buun_tool.formats.recipes import DrafterGeometry, TargetGeometry
from buun_tool.plan.flags import FitFlags

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


def draft_cells(f: FitFlags, d: DrafterGeometry) -> int:
    """The drafter's KV cells: the target's, or in a window of N (-cd N, else the drafter's own
    sliding window) a sliding-window cache of pad256(min(cells, N + ubatch)) per sequence
    (llama_kv_cache_iswa)."""
    full = cells(f.ctx, f.n_parallel)
    window = f.draft_ctx or d.sliding_window
    if not window:
        return full
    per_seq = full // f.n_parallel
    return _pad(min(per_seq, window + min(f.ubatch, f.batch))) * f.n_parallel


def drafter_kv(d: DrafterGeometry, f: FitFlags) -> int:
    if not f.spec:
        return 0
    row = d.num_key_value_heads * d.head_dim
    return int(d.num_hidden_layers * draft_cells(f, d) * row * 2 * kv_type_bytes(f.draft_cache_type))


# A CUDA build's target compute buffer holds less of a layer's activations than the CPU build's:
# AR at -ub 64 (full scale, H200) held 16.0 MiB, 0.75 of it the mask, where the CPU fit says 17.0
# for the activations. So on CUDA the chain's 16 logits rows (15.2 MiB) weigh about as much, and a
# tree's extra rows add in full (budget 22: +6.77 MiB measured, +6.54 predicted with this factor).
CUDA_ACTIVATIONS = 15.25 / 17.0


def target_compute(t: TargetGeometry, f: FitFlags, cuda: bool = False) -> int:
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
    """target_compute's terms: (a layer's activations and rollback states, the verify's logits,
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
