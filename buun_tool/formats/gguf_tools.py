"""GGUF tools: `inspect` a file, and `migrate` a drafter from the buun fork's format to upstream's.

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

import math
import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    LlamaFileType,
)

from buun_tool.base.errors import UsageError
from buun_tool.base.fsutil import replaced

FORK_ARCH = "dflash-draft"
UPSTREAM_ARCH = "dflash"
FORK_TENSORS = {"dflash_fc": "fc", "dflash_hidden_norm": "enc.output_norm"}
FORK_LAYER_TENSORS = {"post_attention_norm": "ffn_norm"}
# The tensors of an upstream DFlash draft (no token_embd/output: the target's are shared).
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
GLOBAL_TENSORS = ("fc", "enc.output_norm", "output_norm")
OPTIONAL_TENSORS = ("token_embd.weight", "output.weight")
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
_ARRAY_PREVIEW = 16
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads (1 stored counts in 32 bits)
MAX_DIMS = 4  # GGML_MAX_DIMS


# --- reading and writing GGUF ---------------------------------------------------------------
# gguf-py's GGUFReader builds a numpy object per vocabulary string at open: 20+ seconds for
# Qwen's 248k tokens and 500k merges. This reader decodes a value only when asked and copies
# raw bytes, so inspecting or migrating a drafter takes about a second. gguf-py still provides
# the format's constants (value types, quant block sizes, file types).

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass
class Kv:
    key: str
    vtype: GGUFValueType
    sub: GGUFValueType | None  # element type of an array
    count: int  # array length (1 for a scalar)
    start: int  # where the value's type field starts in the file
    end: int
    _buf: Any = field(repr=False, default=None)

    def raw(self) -> bytes:
        """The type and the value as stored: copied as is into a rewritten file."""
        return bytes(self._buf[self.start:self.end])

    @property
    def value(self) -> Any:
        offset = self.start + 4
        if self.vtype != GGUFValueType.ARRAY:
            return _decode(self._buf, offset, self.vtype)[0]
        offset += 12
        assert self.sub is not None
        if self.sub in _SCALARS:
            fmt = _SCALARS[self.sub]
            return np.frombuffer(self._buf, dtype=np.dtype(fmt), count=self.count, offset=offset).tolist()
        out = []
        for _ in range(self.count):
            v, offset = _decode(self._buf, offset, self.sub)
            out.append(v)
        return out


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ne0 first, as ggml counts
    ggml_type: GGMLQuantizationType
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


def _decode(buf: Any, offset: int, vtype: GGUFValueType) -> tuple[Any, int]:
    if vtype == GGUFValueType.STRING:
        (n,) = struct.unpack_from("<Q", buf, offset)
        if offset + 8 + n > len(buf):
            raise ValueError(f"a string of {n} bytes at offset {offset} runs past the end of the file")
        return bytes(buf[offset + 8:offset + 8 + n]).decode("utf-8", errors="replace"), offset + 8 + n
    if vtype == GGUFValueType.ARRAY:
        raise ValueError("nested GGUF arrays are not supported")
    fmt = _SCALARS[vtype]
    return struct.unpack_from(fmt, buf, offset)[0], offset + struct.calcsize(fmt)


def _skip_array(buf: Any, offset: int, sub: GGUFValueType, count: int) -> int:
    if sub in _SCALARS:
        return offset + count * struct.calcsize(_SCALARS[sub])
    if sub != GGUFValueType.STRING:
        raise ValueError("nested GGUF arrays are not supported")
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", buf, offset)
        offset += 8 + n
        if offset > len(buf):
            raise ValueError("an array of strings runs past the end of the file")
    return offset


def tensor_nbytes(dims: tuple[int, ...], ggml_type: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[ggml_type]
    return math.prod(dims) // block * size


def not_a_file(path: Path, label: str, option: str | None = None) -> UsageError | None:
    """The error for a GGUF's path that is there but is not a file: a folder ("does not exist"
    would send the user looking for it) or a device or a pipe (opening a FIFO waits for a writer
    forever, llama-server's open too). `label` names the path as the user gave it ("--target PATH",
    "the drafter PATH"), the hint names the `option` that takes it. None for a file, and for
    nothing there: that error is the caller's, whose fix differs (a pull, a convert, a typo)."""
    give = f"pass {option} with the path of a .gguf file" if option else "pass the path of a .gguf file"
    if path.is_dir():
        return UsageError(f"{label} is a folder, not a GGUF file", f"{give} in it")
    if path.exists() and not path.is_file():
        return UsageError(f"{label} is a device or a pipe, not a GGUF file", give)
    return None


class GgufFile:
    """A GGUF file opened read-only through mmap: key/values and tensor infos."""

    def __init__(self, path: Path):
        self.path = Path(path)
        problem = not_a_file(self.path, str(path))
        if problem:
            raise problem
        if not self.path.exists():
            raise UsageError(f"{path} does not exist")
        self._fh = open(self.path, "rb")
        try:
            self._buf = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse()
        except (ValueError, struct.error, KeyError, UnicodeDecodeError) as exc:
            self.close()
            raise UsageError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})",
                             "the file is damaged or not a GGUF: get it again from its source (a file of a "
                             "recipe: `buun pull --verify RECIPE` checks it and downloads it again)") from None

    def close(self) -> None:
        buf = getattr(self, "_buf", None)
        if buf is not None:
            buf.close()
        self._fh.close()

    def __enter__(self) -> GgufFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _parse(self) -> None:
        buf = self._buf
        if len(buf) < 24:
            raise ValueError(f"{len(buf)} bytes, shorter than a GGUF header")
        magic, self.version, n_tensors, n_kv = struct.unpack_from("<IIQQ", buf, 0)
        if magic != GGUF_MAGIC:
            raise ValueError("bad magic (not a GGUF file, or a big-endian one)")
        if self.version not in GGUF_VERSIONS:
            raise ValueError(f"GGUF version {self.version}; llama.cpp reads versions 2 and 3")
        offset = 24
        # counts no file of this size can hold are refused before a loop runs over them: a key
        # takes at least 13 bytes (name length, type, a uint8), a tensor info 24
        if n_kv * 13 + n_tensors * 24 > len(buf) - offset:
            raise ValueError(f"the header's key count {n_kv} and tensor count {n_tensors} are more than the "
                             f"file's {len(buf)} bytes hold")
        self.kv: dict[str, Kv] = {}
        for i in range(n_kv):
            key = f"key number {i}"  # until its name is read
            try:
                key, offset = _decode(buf, offset, GGUFValueType.STRING)
                start = offset
                vtype = GGUFValueType(struct.unpack_from("<I", buf, offset)[0])
                offset += 4
                sub, count = None, 1
                if vtype == GGUFValueType.ARRAY:
                    sub_raw, count = struct.unpack_from("<IQ", buf, offset)
                    sub = GGUFValueType(sub_raw)
                    offset += 12
                    # each item takes at least its scalar's size or a string's 8-byte length
                    least = struct.calcsize(_SCALARS[sub]) if sub in _SCALARS else 8
                    if count * least > len(buf) - offset:
                        raise ValueError(f"an array of {count} {sub.name.lower()} items, more than the "
                                         f"{len(buf) - offset} bytes left in the file hold")
                    offset = _skip_array(buf, offset, sub, count)
                elif vtype == GGUFValueType.STRING:
                    offset = _decode(buf, offset, vtype)[1]
                else:
                    offset += struct.calcsize(_SCALARS[vtype])
            except (ValueError, struct.error) as exc:
                raise ValueError(f"{key}: {exc}") from None
            self.kv[key] = Kv(key, vtype, sub, count, start, offset, buf)
        infos = []
        for _ in range(n_tensors):
            name, offset = _decode(buf, offset, GGUFValueType.STRING)
            (n_dims,) = struct.unpack_from("<I", buf, offset)
            if n_dims > MAX_DIMS:
                raise ValueError(f"tensor {name} has {n_dims} dimensions (at most {MAX_DIMS})")
            dims = struct.unpack_from(f"<{n_dims}q", buf, offset + 4)
            ggml_type, rel = struct.unpack_from("<IQ", buf, offset + 4 + 8 * n_dims)
            offset += 4 + 8 * n_dims + 12
            qtype = GGMLQuantizationType(ggml_type)
            if any(d < 0 for d in dims) or math.prod(dims) >= 2**63:
                raise ValueError(f"tensor {name} has an impossible shape {list(dims)}")
            infos.append((name, tuple(int(d) for d in dims), qtype, rel))
        if offset > len(buf):
            raise ValueError("the header runs past the end of the file (truncated download?)")
        self.alignment = self._alignment()
        self.data_start = offset + (-offset % self.alignment)
        self.tensors = [TensorInfo(n, d, t, self.data_start + rel, tensor_nbytes(d, t)) for n, d, t, rel in infos]
        for t in self.tensors:
            if t.offset + t.nbytes > len(buf):
                raise ValueError(f"tensor {t.name} runs past the end of the file (truncated download?)")

    def _alignment(self) -> int:
        """general.alignment as llama.cpp takes it: a uint32, a power of two."""
        kv = self.kv.get("general.alignment")
        if kv is None:
            return GGUF_DEFAULT_ALIGNMENT
        if kv.vtype != GGUFValueType.UINT32:
            raise ValueError(f"general.alignment has type {kv.vtype.name.lower()}, not uint32")
        value = int(kv.value)
        if value <= 0 or value & (value - 1):
            raise ValueError(f"general.alignment is {value}, not a power of two")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    def integer(self, key: str, minimum: int = 0) -> int:
        """An integer key's value, or a UsageError naming the file and the key: a missing key or one
        of another type (a string, a float, an array) is refused, never cast or divided by."""
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad_key(self, key, value, f"an integer >= {minimum}")
        return value

    def integers(self, key: str) -> list[int]:
        """An array of integers, or a UsageError naming the file and the key."""
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise _bad_key(self, key, value, "an array of integers")
        return value

    @property
    def architecture(self) -> str:
        arch = self.get("general.architecture")
        if not isinstance(arch, str):
            raise UsageError(f"{self.path} has no general.architecture: not a model GGUF")
        return arch

    def tensor_bytes(self, t: TensorInfo, chunk: int = 1 << 24) -> Iterator[bytes]:
        for off in range(t.offset, t.offset + t.nbytes, chunk):
            yield self._buf[off:min(off + chunk, t.offset + t.nbytes)]


def _bad_key(f: GgufFile, key: str, value: Any, want: str) -> UsageError:
    found = "it is missing" if value is None else f"it is {value!r}"[:200]
    return UsageError(f"{f.path}: {key} must be {want}; {found}",
                      f"the file was not written by a converter buun knows: `buun gguf inspect {f.path}` "
                      "lists its keys; get the model from another source")


def read_gguf(path: Path) -> GgufFile:
    return GgufFile(path)


def encode_value(vtype: GGUFValueType, value: Any, sub: GGUFValueType | None = None) -> bytes:
    """The type and value of a key, as GGUF stores them."""
    out = struct.pack("<I", vtype)
    if vtype == GGUFValueType.ARRAY:
        assert sub is not None
        out += struct.pack("<IQ", sub, len(value))
        if sub in _SCALARS:
            return out + np.asarray(value, dtype=np.dtype(_SCALARS[sub])).tobytes()
        return out + b"".join(encode_value(sub, v)[4:] for v in value)
    if vtype == GGUFValueType.STRING:
        data = value.encode("utf-8")
        return out + struct.pack("<Q", len(data)) + data
    return out + struct.pack(_SCALARS[vtype], value)


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


# --- inspect --------------------------------------------------------------------------------

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
        m = _BLK.match(t.name)
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


# --- migrate --------------------------------------------------------------------------------

def _upstream_tensor_name(name: str) -> str:
    base, dot, suffix = name.partition(".")
    if base in FORK_TENSORS:
        return FORK_TENSORS[base] + dot + suffix
    m = _BLK.match(name)
    if m:
        kind, dot, suffix = m.group(2).partition(".")
        return f"blk.{m.group(1)}.{FORK_LAYER_TENSORS.get(kind, kind)}{dot}{suffix}"
    return name


def _allowed_tensor(name: str) -> bool:
    m = _BLK.match(name)
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
