"""`buun gguf inspect`: a GGUF file's architecture, hyperparameters, tokenizer summary and tensors
by type, long arrays (the vocabulary) summarised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFValueType, LlamaFileType

from buun_tool.formats.gguf_file import BLK, GgufFile, Kv

_ARRAY_PREVIEW = 16


def _summary_value(kv: Kv) -> Any:
    """A key's value, with long arrays (the vocabulary) summarised."""
    if kv.vtype == GGUFValueType.ARRAY and kv.count > _ARRAY_PREVIEW:
        assert kv.sub is not None
        return f"[{kv.count} x {kv.sub.name.lower()}]"
    return kv.value


def _tensor_summary(f: GgufFile) -> dict[str, Any]:
    by_type: dict[str, dict[str, int]] = {}
    per_layer: dict[str, int] = {}
    global_names, layers = [], set()
    params = 0
    for t in f.tensors:
        entry = by_type.setdefault(t.ggml_type.name, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += t.nbytes
        params += t.n_elements
        m = BLK.match(t.name)
        if m:
            layers.add(int(m.group(1)))
            per_layer[m.group(2)] = per_layer.get(m.group(2), 0) + 1
        else:
            global_names.append(t.name)
    return {"count": len(f.tensors), "parameters": params, "layers": len(layers),
            "by_type": dict(sorted(by_type.items())), "global": sorted(global_names),
            "per_layer": dict(sorted(per_layer.items()))}


def _file_type_name(value: Any) -> str | None:
    try:
        return LlamaFileType(value).name if value is not None else None
    except ValueError:
        return None


def inspect(path: Path) -> dict[str, Any]:
    """Architecture, hyperparameters, tokenizer summary and tensors by type of a GGUF file."""
    with GgufFile(path) as f:
        arch = f.architecture
        groups: dict[str, dict[str, Any]] = {"general": {}, "hparams": {}, "tokenizer": {}, "other": {}}
        for key, kv in f.kv.items():
            if key.startswith(f"{arch}."):
                groups["hparams"][key[len(arch) + 1:]] = _summary_value(kv)
            elif key.startswith("general."):
                groups["general"][key[len("general."):]] = _summary_value(kv)
            elif key.startswith("tokenizer."):
                short = key[len("tokenizer."):]
                groups["tokenizer"][short] = "(set)" if short == "chat_template" else _summary_value(kv)
            else:
                groups["other"][key] = _summary_value(kv)
        return {"file": str(path), "size": f.path.stat().st_size, "version": f.version, "architecture": arch,
                "file_type": _file_type_name(groups["general"].get("file_type")), **groups,
                "tensors": _tensor_summary(f)}
