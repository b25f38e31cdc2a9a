"""`buun gguf migrate`: a drafter from the buun fork's GGUF format to upstream's.

The buun fork published its drafter GGUFs (spiritbuun/Qwen3.5-27B-DFlash-GGUF) under the
architecture `dflash-draft`, which the pinned upstream cannot load. `migrate` rewrites such a
file into the format upstream's converter writes (`dflash`):

| fork                                          | upstream                                        |
|-----------------------------------------------|-------------------------------------------------|
| general.architecture = dflash-draft           | dflash                                          |
| dflash-draft.<key>                            | dflash.<key>                                    |
| dflash-draft.dflash.block_size                | dflash.block_size                               |
| dflash-draft.dflash.mask_token_id             | tokenizer.ggml.mask_token_id                    |
| dflash-draft.dflash.target_layer_ids (ids)    | dflash.target_layers (ids + 1)                  |
| dflash-draft.dflash.n_target_features         | (dropped: upstream derives it, checked here)    |
| (none; M-RoPE target)                         | dflash.rope.dimension_sections = [n_rot/2,0,0,0] |
| dflash_fc / dflash_hidden_norm                | fc / enc.output_norm                            |
| blk.N.post_attention_norm                     | blk.N.ffn_norm                                  |

Tensor data is copied byte for byte. A fork file without a vocabulary takes the target's
(`tokenizer.*` keys) from `--target`, which also tells whether the target uses M-RoPE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from buun_tool.base.errors import UsageError
from buun_tool.formats.gguf_file import BLK, GgufFile
from buun_tool.formats.gguf_write import encode_value, write_gguf

FORK_ARCH = "dflash-draft"
UPSTREAM_ARCH = "dflash"
FORK_TENSORS = {"dflash_fc": "fc", "dflash_hidden_norm": "enc.output_norm"}
FORK_LAYER_TENSORS = {"post_attention_norm": "ffn_norm"}
# The tensors of an upstream DFlash draft (no token_embd/output: the target's are shared).
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
GLOBAL_TENSORS = ("fc", "enc.output_norm", "output_norm")
OPTIONAL_TENSORS = ("token_embd.weight", "output.weight")


def _upstream_tensor_name(name: str) -> str:
    base, dot, suffix = name.partition(".")
    if base in FORK_TENSORS:
        return FORK_TENSORS[base] + dot + suffix
    m = BLK.match(name)
    if m:
        kind, dot, suffix = m.group(2).partition(".")
        return f"blk.{m.group(1)}.{FORK_LAYER_TENSORS.get(kind, kind)}{dot}{suffix}"
    return name


def _allowed_tensor(name: str) -> bool:
    m = BLK.match(name)
    if m:
        return m.group(2).rsplit(".", 1)[0] in LAYER_TENSORS
    return name in OPTIONAL_TENSORS or name.rsplit(".", 1)[0] in GLOBAL_TENSORS


def _uses_mrope(src: GgufFile, target: GgufFile | None, mrope: bool | None) -> bool:
    if mrope is not None:
        return mrope
    if target is None:
        raise UsageError("cannot tell whether the target uses M-RoPE",
                         "pass --target TARGET.gguf (or --mrope / --no-mrope)")
    key = f"{target.architecture}.rope.dimension_sections"
    return key in target.kv and any(target.integers(key))


def _rope_dims(src: GgufFile) -> int:
    for key in ("rope.dimension_count", "attention.key_length"):
        if f"{FORK_ARCH}.{key}" in src.kv:
            return src.integer(f"{FORK_ARCH}.{key}", 1)
    return src.integer(f"{FORK_ARCH}.embedding_length", 1) // src.integer(f"{FORK_ARCH}.attention.head_count", 1)


def _special(src: GgufFile, what: str) -> Any:
    key = f"{FORK_ARCH}.dflash.{what}"
    if key not in src.kv:
        raise UsageError(f"{src.path} has no {key}: not a DFlash drafter of the buun fork")
    return src.integers(key) if what == "target_layer_ids" else src.integer(key, 1 if what == "block_size" else 0)


def _migrated_kv(src: GgufFile, target: GgufFile | None, mrope: bool | None,
                 report: dict[str, Any]) -> dict[str, bytes]:
    """The output's key/values in order: the fork's keys renamed, the special ones converted."""
    T = GGUFValueType
    out = {"general.architecture": encode_value(T.STRING, UPSTREAM_ARCH)}
    special = f"{FORK_ARCH}.dflash."
    for key, kv in src.kv.items():
        if key == "general.architecture":
            continue
        if key.startswith(special):
            if key[len(special):] not in ("block_size", "mask_token_id", "target_layer_ids"):
                report["dropped"].append(key)
            continue
        new = UPSTREAM_ARCH + key[len(FORK_ARCH):] if key.startswith(f"{FORK_ARCH}.") else key
        out[new] = kv.raw()
    out[f"{UPSTREAM_ARCH}.block_size"] = encode_value(T.UINT32, _special(src, "block_size"))
    layers = [i + 1 for i in _special(src, "target_layer_ids")]  # upstream counts from the embedding
    out[f"{UPSTREAM_ARCH}.target_layers"] = encode_value(T.ARRAY, layers, T.INT32)
    if "tokenizer.ggml.model" not in src.kv:
        if target is None:
            raise UsageError(f"{src.path} has no vocabulary (tokenizer.ggml.*)",
                             "pass --target TARGET.gguf to take the target's vocabulary")
        out.update({k: kv.raw() for k, kv in target.kv.items() if k.startswith("tokenizer.")})
        report["vocabulary_from"] = str(target.path)
    out["tokenizer.ggml.mask_token_id"] = encode_value(T.UINT32, _special(src, "mask_token_id"))
    sections = f"{UPSTREAM_ARCH}.rope.dimension_sections"
    if sections not in out and _uses_mrope(src, target, mrope):
        # the draft ropes along the temporal axis only: all of its rotary pairs in section 0
        out[sections] = encode_value(T.ARRAY, [_rope_dims(src) // 2, 0, 0, 0], T.INT32)
        report["added"].append(sections)
    return out


def _check_geometry(src: GgufFile, target: GgufFile | None) -> None:
    """The fc width must match the tapped layers; the target, when given, must have those
    layers and the drafter's hidden size."""
    n_embd = src.integer(f"{FORK_ARCH}.embedding_length", 1)
    ids = _special(src, "target_layer_ids")
    feats_key = f"{FORK_ARCH}.dflash.n_target_features"
    feats = src.integer(feats_key) if feats_key in src.kv else None
    if feats is not None and feats != len(ids) * n_embd:
        raise UsageError(f"{src.path}: n_target_features {feats} != {len(ids)} target layers x {n_embd}")
    fc = next((t for t in src.tensors if t.name.startswith("dflash_fc.")), None)
    if fc is None:
        raise UsageError(f"{src.path} has no dflash_fc tensor")
    width = fc.dims[0] if fc.dims else 0
    if width != len(ids) * n_embd:
        raise UsageError(f"{src.path}: dflash_fc takes {width} features, not {len(ids)} x {n_embd}")
    if target is not None:
        tarch = target.architecture
        t_embd, t_layers = target.integer(f"{tarch}.embedding_length", 1), target.integer(f"{tarch}.block_count", 1)
        if t_embd != n_embd:
            raise UsageError(f"hidden sizes differ: drafter {n_embd}, target {t_embd} ({target.path})")
        if not all(0 <= i < t_layers for i in ids):
            raise UsageError(f"the drafter taps layers {ids}, the target has {t_layers}")


def _check_output(src: Path, dst: Path, target: Path | None, force: bool) -> None:
    """OUT is a new file in a folder that exists: OUT swapped with --target replaced a 16 GB target
    with the drafter, and a folder or a missing one was named by the temporary file's name."""
    if dst.resolve() == src.resolve():
        raise UsageError("the output must be a new file, not the input")
    if target is not None and dst.resolve() == target.resolve():
        raise UsageError(f"the output {dst} is the --target file", "give the output another name")
    if dst.is_dir():
        raise UsageError(f"the output {dst} is a folder", f"give a file's path, e.g. {dst / 'drafter.gguf'}")
    if not dst.parent.is_dir():
        raise UsageError(f"the output's folder {dst.parent} does not exist", "create it, or give another path")
    if dst.exists() and not force:
        raise UsageError(f"the output {dst} exists", "give another path, or pass --force to replace it")


def migrate(src_path: Path, dst_path: Path, target_path: Path | None = None,
            mrope: bool | None = None, force: bool = False) -> dict[str, Any]:
    """Write `dst_path`: the fork-format drafter `src_path` in upstream's DFlash format.

    `target_path` (the target GGUF) gives the vocabulary when the fork file has none, tells
    whether the target uses M-RoPE and checks the pair; `mrope` decides the latter by hand.
    An existing `dst_path` is replaced only with `force`."""
    _check_output(Path(src_path), Path(dst_path), target_path and Path(target_path), force)
    with GgufFile(src_path) as src:
        arch = src.architecture
        if arch == UPSTREAM_ARCH:
            raise UsageError(f"{src_path} is already in upstream's format (architecture {arch})")
        if arch != FORK_ARCH:
            raise UsageError(f"{src_path} has architecture {arch!r}, not the fork's {FORK_ARCH!r}")
        target = GgufFile(target_path) if target_path else None
        try:
            report: dict[str, Any] = {"source": str(src_path), "output": str(dst_path), "vocabulary_from": "source",
                                      "added": [], "dropped": [], "renamed_tensors": {}}
            _check_geometry(src, target)
            kvs = _migrated_kv(src, target, mrope, report)
            tensors = []
            for t in src.tensors:
                new = _upstream_tensor_name(t.name)
                if not _allowed_tensor(new):
                    raise UsageError(f"tensor {t.name} has no counterpart in upstream's DFlash format")
                if new != t.name:
                    report["renamed_tensors"][t.name] = new
                tensors.append((new, src, t))
            write_gguf(Path(dst_path), list(kvs.items()), tensors, src.alignment)
        finally:
            if target is not None:
                target.close()
    report["tensors"] = len(tensors)
    return report
