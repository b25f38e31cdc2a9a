"""The models of a recipe, planned: every tensor (name, shape, type) and every metadata key of a
random-weight target and drafter with the recipe's geometry, without their bytes.

    plan_pair(recipe, scale, target_type, draft_type)  ->  PairPlan (the target's and the drafter's ModelPlan)

`buun synth` (measure/synth.py) writes these plans as GGUFs; `buun fit` and `buun doctor` weigh
them (bytes by type) without writing anything. The tensor names and shapes follow llama.cpp's
loaders for arch `qwen35` (target) and `dflash` (drafter, the upstream format:
`dflash.target_layers` = HF target_layer_ids + 1).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from buun_tool.base.errors import UsageError
from buun_tool.formats import gguf_tools
from buun_tool.formats.recipes import SPECIAL_TOKENS, DrafterGeometry, Recipe, TargetGeometry

QT = gguf.GGMLQuantizationType
FORMAT_VERSION = 2  # bump when the bytes `buun synth` writes for the same inputs change

# name -> (ggml type of the big matrices, llama_ftype written to general.file_type)
TARGET_TYPES: dict[str, tuple[QT, int]] = {
    "q4_k_m": (QT.Q4_K, 15), "q4_k": (QT.Q4_K, 14), "q5_k": (QT.Q5_K, 17), "q6_k": (QT.Q6_K, 18),
    "q8_0": (QT.Q8_0, 7), "f16": (QT.F16, 1), "bf16": (QT.BF16, 32),
    # f32 matrices: no quantized activations, so single-token and batched decoding agree to float
    # rounding (~1e-6): what the correctness harness needs to compare states tightly
    "f32": (QT.F32, 0),
}
DRAFT_TYPES = {k: v for k, v in TARGET_TYPES.items() if k != "q4_k_m"}

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Words that get whole-word merges, so English prose and Python code tokenize in a number of
# tokens nearer a real BPE than one token per byte.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will can more about said what "
    "out up them into do time some could new two than first other only then its also after over most these "
    "how may like any well each number result value list return def class import from none true false self "
    "print range len int str float dict while elif else try except raise with yield lambda pass break "
    "continue assert global string sum max min sort sorted key append index count find total answer step "
    "solve equation integer prime divide multiply add minus plus equal times square root problem story write "
    "city river night light water world people story because between through during before under again"
).split()


# --- tensors ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row (input) length
    qtype: QT
    init: str = "matrix"  # matrix | ones | normal | decay
    std: float = 0.0  # for init == "normal"
    live_rows: int | None = None  # rows from this index on are zero (never-sampled special tokens)

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        if self.ne[0] % block:
            raise UsageError(f"{self.name}: row length {self.ne[0]} is not a multiple of the "
                             f"{self.qtype.name} block ({block}); pick sizes that are multiples of 256")
        return math.prod(self.ne[1:]) * (self.ne[0] // block) * size


@dataclass
class ModelPlan:
    """Everything a GGUF holds except its tensor bytes."""

    arch: str
    kv: list[tuple[str, Any]] = field(default_factory=list)
    tensors: list[TensorSpec] = field(default_factory=list)

    def add(self, key: str, value: Any) -> None:
        self.kv.append((key, value))

    def add_all(self, kv: dict[str, Any]) -> None:
        self.kv.extend(kv.items())

    def matrix(self, name: str, n_in: int, n_out: int, qtype: QT) -> None:
        self.tensors.append(TensorSpec(name, (n_in, n_out), qtype))

    def vector(self, name: str, ne: tuple[int, ...], init: str = "ones", std: float = 0.0) -> None:
        self.tensors.append(TensorSpec(name, ne, QT.F32, init, std))

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _more_bits(i: int, n: int) -> bool:
    """llama-quantize's Q4_K_M rule: which attn_v / ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class _TargetTypes:
    """The type of each target matrix: one type everywhere, or llama-quantize's Q4_K_M mix."""

    def __init__(self, name: str, geo: TargetGeometry):
        self.base, self.ftype = TARGET_TYPES[name]
        self.mix = name == "q4_k_m"
        self.n_layer = geo.num_hidden_layers
        self.n_attn_v = geo.n_full_attention

    def of(self, role: str, index: int = 0) -> QT:
        if not self.mix:
            return self.base
        if role == "output":
            return QT.Q6_K
        if role == "attn_qkv":
            return QT.Q5_K
        if role == "attn_v" and _more_bits(index, self.n_attn_v):
            return QT.Q6_K
        if role == "ffn_down" and _more_bits(index, self.n_layer):
            return QT.Q6_K
        return QT.Q4_K


NAME_PREFIX = "SYNTHETIC "  # the general.name of every model buun synth writes begins so


def is_synthetic(path: Path) -> bool:
    """Whether a GGUF is one of buun synth's random-weight models (its general.name says so); a
    file that is not a readable GGUF is not, and is left for its user to refuse."""
    try:
        with gguf_tools.GgufFile(path) as f:
            return str(f.get("general.name", "")).startswith(NAME_PREFIX)
    except UsageError:
        return False


def _common_kv(plan: ModelPlan, label: str, ftype: int, ctx: int, n_embd: int, n_layer: int, n_ff: int,
               n_head: int, n_head_kv: int, head_dim: int, eps: float, theta: float) -> None:
    a = plan.arch
    plan.add("general.name", f"{NAME_PREFIX}{label} (random weights)")
    plan.add("general.description", "random-weight model written by `buun synth` for speed and memory "
                                    "measurements; its output is meaningless")
    plan.add("general.file_type", ftype)
    plan.add("general.quantization_version", 2)
    plan.add(f"{a}.context_length", ctx)
    plan.add(f"{a}.embedding_length", n_embd)
    plan.add(f"{a}.block_count", n_layer)
    plan.add(f"{a}.feed_forward_length", n_ff)
    plan.add(f"{a}.attention.head_count", n_head)
    plan.add(f"{a}.attention.head_count_kv", n_head_kv)
    plan.add(f"{a}.attention.key_length", head_dim)
    plan.add(f"{a}.attention.value_length", head_dim)
    plan.add(f"{a}.attention.layer_norm_rms_epsilon", float(eps))
    plan.add(f"{a}.rope.freq_base", float(theta))


def target_plan(geo: TargetGeometry, type_name: str, label: str, special_base: int) -> ModelPlan:
    """The qwen35 GGUF of the target: gated full attention every `full_attention_interval`
    layers, Gated DeltaNet in the others, untied lm_head, no MTP block."""
    types = _TargetTypes(type_name, geo)
    p = ModelPlan("qwen35")
    _common_kv(p, label, types.ftype, geo.max_position_embeddings, geo.hidden_size, geo.num_hidden_layers,
               geo.intermediate_size, geo.num_attention_heads, geo.num_key_value_heads, geo.head_dim,
               geo.rms_norm_eps, geo.rope_theta)
    p.add_all({
        "qwen35.rope.dimension_count": geo.n_rot,
        "qwen35.rope.dimension_sections": [*geo.mrope_section, 0][:4],
        "qwen35.ssm.conv_kernel": geo.linear_conv_kernel_dim,
        "qwen35.ssm.state_size": geo.linear_key_head_dim,
        "qwen35.ssm.group_count": geo.linear_num_key_heads,
        "qwen35.ssm.time_step_rank": geo.linear_num_value_heads,
        "qwen35.ssm.inner_size": geo.value_dim,
        "qwen35.full_attention_interval": geo.full_attention_interval,
    })

    e = geo.hidden_size
    p.matrix("token_embd.weight", e, geo.vocab_size, types.of("token_embd"))
    i_attn = 0
    for il in range(geo.num_hidden_layers):
        b = f"blk.{il}."
        p.vector(b + "attn_norm.weight", (e,))
        p.vector(b + "post_attention_norm.weight", (e,))
        if geo.is_full_attention(il):
            _full_attention(p, b, geo, types, i_attn)
            i_attn += 1
        else:
            _delta_net(p, b, geo, types)
        p.matrix(b + "ffn_gate.weight", e, geo.intermediate_size, types.of("ffn_gate"))
        p.matrix(b + "ffn_down.weight", geo.intermediate_size, e, types.of("ffn_down", il))
        p.matrix(b + "ffn_up.weight", e, geo.intermediate_size, types.of("ffn_up"))
    p.vector("output_norm.weight", (e,))
    p.matrix("output.weight", e, geo.vocab_size, types.of("output"))
    p.tensors[-1] = TensorSpec("output.weight", p.tensors[-1].ne, p.tensors[-1].qtype, live_rows=special_base)
    return p


def _full_attention(p: ModelPlan, b: str, geo: TargetGeometry, types: _TargetTypes, i_attn: int) -> None:
    e, hd = geo.hidden_size, geo.head_dim
    p.matrix(b + "attn_q.weight", e, 2 * hd * geo.num_attention_heads, types.of("attn_q"))  # query + output gate
    p.matrix(b + "attn_k.weight", e, hd * geo.num_key_value_heads, types.of("attn_k"))
    p.matrix(b + "attn_v.weight", e, hd * geo.num_key_value_heads, types.of("attn_v", i_attn))
    p.matrix(b + "attn_output.weight", hd * geo.num_attention_heads, e, types.of("attn_output"))
    p.vector(b + "attn_q_norm.weight", (hd,))
    p.vector(b + "attn_k_norm.weight", (hd,))


def _delta_net(p: ModelPlan, b: str, geo: TargetGeometry, types: _TargetTypes) -> None:
    e, v_heads = geo.hidden_size, geo.linear_num_value_heads
    p.matrix(b + "attn_qkv.weight", e, geo.conv_dim, types.of("attn_qkv"))
    p.matrix(b + "attn_gate.weight", e, geo.value_dim, types.of("attn_gate"))
    p.vector(b + "ssm_conv1d.weight", (geo.linear_conv_kernel_dim, geo.conv_dim), "normal", 0.5)
    p.vector(b + "ssm_dt.bias", (v_heads,), "normal", 0.5)
    p.vector(b + "ssm_a", (v_heads,), "decay")
    p.matrix(b + "ssm_beta.weight", e, v_heads, types.of("ssm_beta"))
    p.matrix(b + "ssm_alpha.weight", e, v_heads, types.of("ssm_alpha"))
    p.vector(b + "ssm_norm.weight", (geo.linear_value_head_dim,))
    p.matrix(b + "ssm_out.weight", geo.value_dim, e, types.of("ssm_out"))


def drafter_plan(geo: DrafterGeometry, target: TargetGeometry, type_name: str, label: str) -> ModelPlan:
    """The upstream `dflash` GGUF: fc over the tapped target layers, then plain attention layers.
    No token_embd/output: llama.cpp borrows the target's at run time, as with the real drafter."""
    qt, ftype = DRAFT_TYPES[type_name]
    p = ModelPlan("dflash")
    _common_kv(p, label, ftype, target.max_position_embeddings, geo.hidden_size, geo.num_hidden_layers,
               geo.intermediate_size, geo.num_attention_heads, geo.num_key_value_heads, geo.head_dim,
               geo.rms_norm_eps, geo.rope_theta)
    # an M-RoPE target: the drafter ropes over its whole head on the temporal section only
    p.add("dflash.rope.dimension_sections", [geo.head_dim // 2, 0, 0, 0])
    p.add("dflash.block_size", geo.block_size)
    p.add("dflash.target_layers", [i + 1 for i in geo.target_layer_ids])
    if geo.sliding_window:
        p.add("dflash.attention.sliding_window", geo.sliding_window)
        p.add("dflash.attention.sliding_window_pattern", [True] * geo.num_hidden_layers)
    if geo.is_dflash2:
        p.add_all({"dflash.conv_kernel_size": geo.conv_kernel_size, "dflash.conv_group_size": geo.conv_group_size,
                   "dflash.selector_rank": geo.selector_rank, "dflash.selector_top_k": geo.selector_top_k})

    e, hd = geo.hidden_size, geo.head_dim
    p.matrix("fc.weight", len(geo.target_layer_ids) * e, e, qt)
    p.vector("enc.output_norm.weight", (e,))
    for il in range(geo.num_hidden_layers):
        b = f"blk.{il}."
        p.vector(b + "attn_norm.weight", (e,))
        p.matrix(b + "attn_q.weight", e, hd * geo.num_attention_heads, qt)
        p.matrix(b + "attn_k.weight", e, hd * geo.num_key_value_heads, qt)
        p.matrix(b + "attn_v.weight", e, hd * geo.num_key_value_heads, qt)
        p.matrix(b + "attn_output.weight", hd * geo.num_attention_heads, e, qt)
        p.vector(b + "attn_q_norm.weight", (hd,))
        p.vector(b + "attn_k_norm.weight", (hd,))
        p.vector(b + "ffn_norm.weight", (e,))
        p.matrix(b + "ffn_gate.weight", e, geo.intermediate_size, qt)
        p.matrix(b + "ffn_down.weight", geo.intermediate_size, e, qt)
        p.matrix(b + "ffn_up.weight", e, geo.intermediate_size, qt)
        if geo.is_dflash2:
            _dflash2_convs(p, b, geo, qt)
    p.vector("output_norm.weight", (e,))
    if geo.is_dflash2:
        # the selector: token codebooks (read by get_rows) and the hidden state's gate
        p.matrix("selector_predecessor.weight", geo.selector_rank, target.vocab_size, qt)
        p.matrix("selector_successor.weight", geo.selector_rank, target.vocab_size, qt)
        p.matrix("selector_hidden.weight", e, geo.selector_rank, qt)
    return p


def _dflash2_convs(p: ModelPlan, b: str, geo: DrafterGeometry, qt: QT) -> None:
    """DFlash2's convolution around the attention and the FFN: a base kernel of both sides'
    taps per channel (f32, as the converter leaves it) and a projection to the dynamic part,
    one coefficient per tap, group and side."""
    e = geo.hidden_size
    projected = 2 * geo.conv_kernel_size * (e // geo.conv_group_size)
    for part in ("attn", "ffn"):
        p.vector(f"{b}{part}_conv_base", (e, geo.conv_kernel_size, 2), "normal", 0.5)
        p.matrix(f"{b}{part}_conv_proj.weight", e, projected, qt)


# --- vocabulary ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special_base: int  # first special token (<|endoftext|>)
    mask: int

    @property
    def im_end(self) -> int:
        return self.special_base + SPECIAL_TOKENS.index("<|im_end|>")


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte, indexed by byte value."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    for i, b in enumerate(extra):
        chars[b] = chr(256 + i)
    return [chars[b] for b in range(256)]


def _word_merges(alphabet: list[str]) -> tuple[list[str], list[str]]:
    """Left-to-right merges spelling each word, bare and with a leading space."""
    space, newline = alphabet[ord(" ")], alphabet[ord("\n")]
    tokens: list[str] = []
    merges: list[str] = []
    seen = set(alphabet)

    def merge(a: str, b: str) -> None:
        if a + b not in seen:
            seen.add(a + b)
            merges.append(f"{a} {b}")
            tokens.append(a + b)

    for word in dict.fromkeys(_WORDS):
        for i in range(1, len(word)):
            merge(word[:i], word[i])
        merge(space, word)
    merge(newline, newline)
    merge(space, space)
    return tokens, merges


def build_vocab(vocab_size: int, special_base: int, mask: int) -> Vocab:
    """A byte-level BPE vocabulary of `vocab_size` with the specials at their real Qwen3.5 ids."""
    alphabet = _byte_alphabet()
    words, merges = _word_merges(alphabet)
    tokens = alphabet + words
    if len(tokens) > special_base:
        raise UsageError(f"vocabulary: {len(tokens)} byte and word tokens do not fit below id {special_base}")
    tokens += [f"<synth_{i}>" for i in range(special_base - len(tokens))]  # unreachable filler
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    for i in range(special_base, vocab_size):
        offset = i - special_base
        if offset < len(SPECIAL_TOKENS):
            tokens.append(SPECIAL_TOKENS[offset])
        elif i == mask:
            tokens.append("<|mask|>")
        elif i <= mask:
            tokens.append(f"<|reserved_{offset}|>")
        else:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        types.append(int(gguf.TokenType.CONTROL))
    return Vocab(tokens, types, merges, special_base, mask)


def _vocab_kv(plan: ModelPlan, vocab: Vocab, with_mask: bool) -> None:
    plan.add_all({
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": vocab.tokens,
        "tokenizer.ggml.token_type": vocab.types,
        "tokenizer.ggml.merges": vocab.merges,
        "tokenizer.ggml.bos_token_id": vocab.special_base,
        "tokenizer.ggml.eos_token_id": vocab.im_end,
        "tokenizer.ggml.padding_token_id": vocab.special_base,
        "tokenizer.ggml.add_bos_token": False,
    })
    if with_mask:
        plan.add("tokenizer.ggml.mask_token_id", vocab.mask)
    plan.add("tokenizer.chat_template", CHATML_TEMPLATE)


# --- the pair --------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairPlan:
    target: ModelPlan
    drafter: ModelPlan
    target_name: str
    drafter_name: str
    inputs: dict[str, Any]

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()[:16]


def plan_pair(recipe: Recipe, scale: str = "tiny", target_type: str = "q4_k_m", draft_type: str = "q4_k",
              seed: int = 0) -> PairPlan:
    """The tensors and metadata of both files, without writing anything."""
    if target_type not in TARGET_TYPES:
        raise UsageError(f"unknown target type {target_type!r}", f"valid: {', '.join(TARGET_TYPES)}")
    if draft_type not in DRAFT_TYPES:
        raise UsageError(f"unknown draft type {draft_type!r}", f"valid: {', '.join(DRAFT_TYPES)}")
    if seed < 0:  # numpy's seed sequence takes no negative number: a ValueError traceback midway
        raise UsageError(f"--seed {seed}: expected 0 or more")
    geo = recipe.geometry_at(scale)
    tgeo, dgeo = geo.target, geo.drafter
    vocab = build_vocab(tgeo.vocab_size, tgeo.eos_token_id, dgeo.mask_token_id)
    label = f"{recipe.name} ({scale})"
    target = target_plan(tgeo, target_type, f"{label} target", vocab.special_base)
    drafter = drafter_plan(dgeo, tgeo, draft_type, f"{label} DFlash drafter")
    _vocab_kv(target, vocab, with_mask=False)
    _vocab_kv(drafter, vocab, with_mask=True)
    inputs = {"format": FORMAT_VERSION, "recipe": recipe.name, "scale": scale, "seed": seed,
              "target_type": target_type, "draft_type": draft_type,
              "geometry": geo.to_json()}
    stem = f"synth-{recipe.name}-{scale}"
    return PairPlan(target, drafter, f"{stem}-{target_type}.gguf", f"{stem}-dflash-{draft_type}.gguf", inputs)



def summary(plan: ModelPlan) -> dict[str, Any]:
    """Tensor count, parameters and bytes by type: what `buun synth --dry-run` shows."""
    by_type: dict[str, int] = {}
    for t in plan.tensors:
        by_type[t.qtype.name] = by_type.get(t.qtype.name, 0) + t.nbytes
    return {"arch": plan.arch, "tensors": len(plan.tensors),
            "params": sum(math.prod(t.ne) for t in plan.tensors),
            "tensor_bytes": plan.tensor_bytes, "bytes_by_type": by_type}
