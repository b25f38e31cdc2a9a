"""Reading GGUF files: the header, the key/values and the tensor infos of a file opened read-only
through mmap, each value decoded only when asked; a damaged file is a UsageError naming it."""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from buun_tool.base.errors import UsageError

BLK = re.compile(r"^blk\.(\d+)\.(.+)$")  # a layer's tensor: blk.N.<kind>[.weight]
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads (1 stored counts in 32 bits)
MAX_DIMS = 4  # GGML_MAX_DIMS


# Why a reader of its own:
# gguf-py's GGUFReader builds a numpy object per vocabulary string at open: 20+ seconds for
# Qwen's 248k tokens and 500k merges. This reader decodes a value only when asked and copies
# raw bytes, so inspecting or migrating a drafter takes about a second. gguf-py still provides
# the format's constants (value types, quant block sizes, file types).

SCALARS: dict[GGUFValueType, str] = {
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
        if self.sub in SCALARS:
            fmt = SCALARS[self.sub]
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
    fmt = SCALARS[vtype]
    return struct.unpack_from(fmt, buf, offset)[0], offset + struct.calcsize(fmt)


def _skip_array(buf: Any, offset: int, sub: GGUFValueType, count: int) -> int:
    if sub in SCALARS:
        return offset + count * struct.calcsize(SCALARS[sub])
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


def check_given(option: str, path: Path) -> None:
    """A GGUF passed with `option` (--target, --drafter) is a file that is there, else the error
    that says which and what to pass."""
    problem = not_a_file(path, f"{option} {path}", option)
    if problem:
        raise problem
    if not path.is_file():
        raise UsageError(f"{option} {path} does not exist", "pass the path of an existing GGUF")


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
                    least = struct.calcsize(SCALARS[sub]) if sub in SCALARS else 8
                    if count * least > len(buf) - offset:
                        raise ValueError(f"an array of {count} {sub.name.lower()} items, more than the "
                                         f"{len(buf) - offset} bytes left in the file hold")
                    offset = _skip_array(buf, offset, sub, count)
                elif vtype == GGUFValueType.STRING:
                    offset = _decode(buf, offset, vtype)[1]
                else:
                    offset += struct.calcsize(SCALARS[vtype])
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
