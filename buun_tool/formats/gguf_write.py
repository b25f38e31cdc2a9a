"""Writing GGUF files: a key's type and value as GGUF stores them, and a whole file (v3) from
encoded key/values and tensors copied byte for byte out of open files."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from buun_tool.base.fsutil import replaced
from buun_tool.formats.gguf_file import SCALARS, GgufFile, TensorInfo


def encode_value(vtype: GGUFValueType, value: Any, sub: GGUFValueType | None = None) -> bytes:
    """The type and value of a key, as GGUF stores them."""
    out = struct.pack("<I", vtype)
    if vtype == GGUFValueType.ARRAY:
        assert sub is not None
        out += struct.pack("<IQ", sub, len(value))
        if sub in SCALARS:
            return out + np.asarray(value, dtype=np.dtype(SCALARS[sub])).tobytes()
        return out + b"".join(encode_value(sub, v)[4:] for v in value)
    if vtype == GGUFValueType.STRING:
        data = value.encode("utf-8")
        return out + struct.pack("<Q", len(data)) + data
    return out + struct.pack(SCALARS[vtype], value)


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def write_gguf(dst: Path, kvs: list[tuple[str, bytes]], tensors: list[tuple[str, GgufFile, TensorInfo]],
               alignment: int = GGUF_DEFAULT_ALIGNMENT) -> None:
    """Write a GGUF (v3) from encoded key/values and tensors copied out of open files, under a
    temporary name renamed into place at the end, once its bytes are on the disk."""
    dst = Path(dst)
    with replaced(dst, "partial") as tmp, open(tmp, "wb") as out:
        out.write(struct.pack("<IIQQ", GGUF_MAGIC, 3, len(tensors), len(kvs)))
        for key, raw in kvs:
            out.write(_string(key) + raw)
        rel = 0
        for name, _, t in tensors:
            out.write(_string(name) + struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims)
                      + struct.pack("<IQ", t.ggml_type, rel))
            rel += t.nbytes + (-t.nbytes % alignment)
        out.write(b"\0" * (-out.tell() % alignment))
        for _, src, t in tensors:
            for chunk in src.tensor_bytes(t):
                out.write(chunk)
            out.write(b"\0" * (-t.nbytes % alignment))
        out.flush()
        os.fsync(out.fileno())
