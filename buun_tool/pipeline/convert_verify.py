"""The convert stage's check of a GGUF it made: the file read back (gguf_tools' reader, gguf-py's
format constants) against the two configs: architecture, block size, mask token, tapped layers
(+1), hidden size, vocabulary size, M-RoPE sections, a DFlash2 drafter's selector, the exact tensor
set and the quant type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from buun_tool.base.errors import BuunError
from buun_tool.formats.gguf_tools import GLOBAL_TENSORS, LAYER_TENSORS, OPTIONAL_TENSORS, GgufFile

FLOAT_TYPES = ("F32", "F16", "BF16")  # the types the converter writes itself: no llama-quantize


# A DFlash2 drafter's own tensors (the pinned llama.cpp's names): the selector's, and per layer the
# convolutions' base kernels (f32, no `.weight`: llama-quantize leaves them) and projections
DFLASH2_TENSORS = ("selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight")
DFLASH2_F32 = ("attn_conv_base", "ffn_conv_base")
DFLASH2_LAYER_TENSORS = (*DFLASH2_F32, "attn_conv_proj.weight", "ffn_conv_proj.weight")


def expected_tensors(n_layers: int, dflash2: bool = False) -> set[str]:
    names = {f"{g}.weight" for g in GLOBAL_TENSORS}
    names |= {f"blk.{i}.{t}.weight" for i in range(n_layers) for t in LAYER_TENSORS}
    if dflash2:
        names |= set(DFLASH2_TENSORS) | {f"blk.{i}.{t}" for i in range(n_layers) for t in DFLASH2_LAYER_TENSORS}
    return names


def _file_type(quant: str) -> int:
    import gguf

    return int(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType[f"MOSTLY_{quant}"])


def _read_back(f: GgufFile) -> dict[str, Any]:
    arch = f.get("general.architecture")
    types: dict[str, int] = {}
    for t in f.tensors:
        types[t.ggml_type.name] = types.get(t.ggml_type.name, 0) + 1
    tokens = f.kv.get("tokenizer.ggml.tokens")
    return {
        "architecture": arch,
        "block_size": f.get(f"{arch}.block_size"),
        "mask_token_id": f.get("tokenizer.ggml.mask_token_id"),
        "target_layers": f.get(f"{arch}.target_layers"),
        "hidden_size": f.get(f"{arch}.embedding_length"),
        "block_count": f.get(f"{arch}.block_count"),
        "rope_sections": f.get(f"{arch}.rope.dimension_sections"),
        "vocab_tokens": tokens.count if tokens else 0,
        "file_type": f.get("general.file_type"),
        "tensor_count": len(f.tensors),
        "tensor_types": dict(sorted(types.items())),
        "selector_top_k": f.get(f"{arch}.selector_top_k"),
    }


def verify(path: Path, facts: dict[str, Any], quant: str) -> dict[str, Any]:
    """Read the GGUF back and compare it with what the configs say; raise with every mismatch."""
    with GgufFile(path) as f:
        got = _read_back(f)
        names = {t.name for t in f.tensors}
        floats = sorted(t.name for t in f.tensors if len(t.dims) >= 2 and t.ggml_type.name in FLOAT_TYPES
                        and not t.name.endswith(DFLASH2_F32))
    want = {
        "architecture": "dflash",
        "block_size": facts["block_size"],
        "mask_token_id": facts["mask_token_id"],
        "target_layers": [i + 1 for i in facts["target_layer_ids"]],  # upstream stores layer ids + 1
        "hidden_size": facts["target_hidden_size"],
        "block_count": facts["num_hidden_layers"],
        "vocab_tokens": facts["target_vocab_size"],
        "file_type": _file_type(quant),
    }
    problems = [f"{k}: expected {v!r}, found {got[k]!r}" for k, v in want.items() if got[k] != v]
    if facts.get("target_mrope") and not got["rope_sections"]:
        problems.append("rope.dimension_sections: missing (the target uses M-RoPE)")
    if facts.get("selector_top_k") and got["selector_top_k"] != facts["selector_top_k"]:
        problems.append(f"selector_top_k: expected {facts['selector_top_k']!r}, found {got['selector_top_k']!r}")
    need = expected_tensors(facts["num_hidden_layers"], bool(facts.get("selector_top_k")))
    if need - names:
        problems.append(f"missing tensors: {', '.join(sorted(need - names))}")
    if names - need - set(OPTIONAL_TENSORS):
        problems.append(f"unexpected tensors: {', '.join(sorted(names - need - set(OPTIONAL_TENSORS)))}")
    if quant not in FLOAT_TYPES and floats:
        problems.append(f"not quantized to {quant}: {', '.join(floats)}")
    if problems:
        raise BuunError(f"{path.name} failed verification:\n  " + "\n  ".join(problems),
                        "the converter or the patches produced an unexpected file; see the convert log")
    return got
