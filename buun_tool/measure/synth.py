"""Synthetic models: random-weight GGUFs with the exact tensors of a recipe's target and drafter.

    write_pair(recipe, out_dir, scale="tiny", seed=0)  ->  (target.gguf, drafter.gguf)

The files load in llama-server and llama-bench and run the same kernels on buffers of the same
size as the real checkpoints, so speed and memory can be measured without downloading weights.
Their output is meaningless. Everything comes from `recipe.geometry_at(scale)`, typed and checked
when the recipe loaded: the tensor names and shapes follow llama.cpp's loaders for arch `qwen35`
(target) and `dflash` (drafter, the upstream format: `dflash.target_layers` = HF
target_layer_ids + 1).

Weights are valid quant blocks with random nibbles and small, finite super-block scales chosen
so a row has a standard deviation near 1/sqrt(n_in): activations stay finite. A pool of random
blocks is made once per (type, row length) and streamed to disk from a random offset for every
tensor, each block with fresh random scales (no two rows repeat), so writing costs seconds per
GB and little memory. The same inputs give byte-identical
files; a stamp beside them makes a repeated call a no-op.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np

from buun_tool.base import console
from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.base.fsutil import replaced
from buun_tool.formats.model_plan import QT, ModelPlan, PairPlan, TensorSpec, plan_pair
from buun_tool.formats.recipes import Recipe

# --- random blocks ---------------------------------------------------------------------------

F16_MIN_NORMAL = 2.0 ** -14
# Standard deviation of one weight in units of the block scale d, for uniformly random quant
# values and 6-bit scales limited to 0..15 (see _pool): derived from the block formulas.
_UNIT_STD = {QT.Q4_K: 63.54, QT.Q5_K: 129.7, QT.Q6_K: 85.69, QT.Q8_0: 73.9}


def _put_f16(raw: np.ndarray, col: int, value: float) -> None:
    raw[:, col:col + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)


def _scale(qt: QT, n_in: int) -> float:
    """The block scale d that gives rows a standard deviation of about 1/sqrt(n_in)."""
    return max(1.0 / math.sqrt(n_in) / _UNIT_STD[qt], F16_MIN_NORMAL)


def _pool(qt: QT, n_in: int, rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """`n_blocks` valid random blocks of type `qt`, as one flat byte array."""
    if qt in (QT.F32, QT.F16, QT.BF16):
        vals = rng.standard_normal(n_blocks, dtype=np.float32) / np.float32(math.sqrt(n_in))
        if qt == QT.F32:
            return vals.view(np.uint8)
        if qt == QT.F16:
            return vals.astype(np.float16).view(np.uint8)
        return (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    size = gguf.GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = _scale(qt, n_in)
    if qt in (QT.Q4_K, QT.Q5_K):
        # layout: d, dmin (f16), 12 bytes of packed 6-bit scales and mins, [qh], qs.
        # Clearing the high nibble of the first 8 scale bytes makes every scale and min 0..15;
        # dmin = mean(q) * d centres the weights on zero.
        raw[:, 4:12] &= 0x0F
        _put_f16(raw, 0, d)
        _put_f16(raw, 2, (7.5 if qt == QT.Q4_K else 15.5) * d)
    elif qt == QT.Q6_K:
        # layout: ql[128], qh[64], int8 scales[16], d (f16): w = d * scale * (q - 32)
        raw[:, 192:208] = rng.integers(-8, 8, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        _put_f16(raw, 208, d)
    elif qt == QT.Q8_0:
        _put_f16(raw, 0, d)  # layout: d (f16), int8 qs[32]
    else:
        raise UsageError(f"no random block generator for {qt.name}")
    return raw.reshape(-1)


class _Pools:
    """One pool of random blocks per (type, row length), made on first use."""

    def __init__(self, rng: np.random.Generator, sizes: dict[tuple[QT, int], int]):
        self.rng = rng
        self.sizes = sizes
        self.pools: dict[tuple[QT, int], np.ndarray] = {}

    @staticmethod
    def sizes_for(tensors: list[TensorSpec], cap: int) -> dict[tuple[QT, int], int]:
        """Bytes per pool: the largest tensor that uses it, at most `cap`, in whole blocks."""
        sizes: dict[tuple[QT, int], int] = {}
        for t in tensors:
            if t.init == "matrix":
                key = (t.qtype, t.ne[0])
                sizes[key] = max(sizes.get(key, 0), min(t.nbytes, cap))
        return sizes

    def get(self, t: TensorSpec) -> np.ndarray:
        key = (t.qtype, t.ne[0])
        if key not in self.pools:
            block_bytes = gguf.GGML_QUANT_SIZES[t.qtype][1]
            n_blocks = max(1, self.sizes[key] // block_bytes)
            self.pools[key] = _pool(t.qtype, t.ne[0], self.rng, n_blocks)
        return self.pools[key]


def _stream(pool: np.ndarray, nbytes: int, unit: int, rng: np.random.Generator, chunk: int) -> Iterator[np.ndarray]:
    """`nbytes` of the pool, as whole blocks, from a random block offset, wrapping around."""
    chunk -= chunk % unit
    pos = int(rng.integers(0, len(pool) // unit)) * unit
    left = nbytes
    while left:
        n = min(left, len(pool) - pos, chunk)
        yield pool[pos:pos + n]
        left -= n
        pos = (pos + n) % len(pool)


def _salt(blocks: np.ndarray, qt: QT, rng: np.random.Generator) -> None:
    """Give every block fresh random scales (in place, on a copy of the pool).

    A tensor longer than its pool repeats the pool's bytes: without this, a 1-block row of the
    lm_head would reappear as another token's row, and identical logits are exact argmax ties
    that batched and single-token decoding break differently."""
    n = len(blocks)
    if qt in (QT.Q4_K, QT.Q5_K):
        blocks[:, 4:16] = rng.integers(0, 256, size=(n, 12), dtype=np.uint8)
        blocks[:, 4:12] &= 0x0F  # every 6-bit scale and min stays 0..15 (see _pool)
    elif qt == QT.Q6_K:
        blocks[:, 192:208] = rng.integers(-8, 8, size=(n, 16), dtype=np.int8).view(np.uint8)
    elif qt == QT.Q8_0:
        d = np.frombuffer(blocks[:1, 0:2].tobytes(), dtype=np.float16)[0]
        jitter = (rng.uniform(0.75, 1.25, n) * np.float32(d)).astype(np.float16)
        blocks[:, 0:2] = jitter.view(np.uint8).reshape(n, 2)
    elif qt == QT.F32:  # random signs (a repeated row comes back uncorrelated) and low mantissa bits
        blocks.view(np.uint32)[:] ^= rng.integers(0, 256, size=(n, 1), dtype=np.uint32) | \
            (rng.integers(0, 2, size=(n, 1), dtype=np.uint32) << 31)
    else:  # F16 / BF16 values: random signs and the two lowest mantissa bits
        blocks.view(np.uint16)[:] ^= rng.integers(0, 4, size=(n, 1), dtype=np.uint16) | \
            (rng.integers(0, 2, size=(n, 1), dtype=np.uint16) << 15)


def _small_tensor(t: TensorSpec, rng: np.random.Generator) -> bytes:
    n = math.prod(t.ne)
    if t.init == "ones":
        values = np.ones(n, dtype=np.float32)
    elif t.init == "normal":
        values = rng.standard_normal(n, dtype=np.float32) * np.float32(t.std)
    elif t.init == "decay":  # ssm_a = -exp(A_log) with A_log ~ log U(1, 16), as the HF init
        values = -rng.uniform(1.0, 16.0, n).astype(np.float32)
    else:
        raise ValueError(t.init)
    return values.tobytes()


# --- writing ---------------------------------------------------------------------------------

POOL_CAP = 32 << 20
CHUNK = 16 << 20


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _write_header(plan: ModelPlan, path: Path) -> int:
    """Header, KV pairs and tensor infos through gguf-py; returns the data alignment."""
    w = gguf.GGUFWriter(path=None, arch=plan.arch)
    for key, value in plan.kv:
        _add_kv(w, key, value)
    for t in plan.tensors:
        shape = tuple(reversed(t.ne))  # gguf-py takes numpy order
        raw = None if t.qtype == QT.F32 else t.qtype
        w.add_tensor_info(t.name, shape, np.dtype(np.float32), t.nbytes, raw_dtype=raw)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return w.data_alignment


def _add_kv(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        # typed arrays skip gguf-py's per-item type check (the vocab has 248k entries)
        items = list(value)
        sub = (gguf.GGUFValueType.STRING if isinstance(items[0], str) else
               gguf.GGUFValueType.BOOL if isinstance(items[0], bool) else gguf.GGUFValueType.INT32)
        w.add_key_value(key, items, gguf.GGUFValueType.ARRAY, sub_type=sub)


def _write_tensor(f: BinaryIO, t: TensorSpec, pools: _Pools, rng: np.random.Generator) -> None:
    if t.init != "matrix":
        f.write(_small_tensor(t, rng))
        return
    unit = gguf.GGML_QUANT_SIZES[t.qtype][1]
    live = t.nbytes if t.live_rows is None else t.nbytes // t.ne[1] * t.live_rows
    for part in _stream(pools.get(t), live, unit, rng, CHUNK):
        blocks = part.reshape(-1, unit).copy()
        _salt(blocks, t.qtype, rng)
        f.write(blocks.data)
    _write_zeros(f, t.nbytes - live)


def _write_zeros(f: BinaryIO, n: int) -> None:
    zeros = bytes(min(n, CHUNK))
    while n:
        f.write(zeros[:min(n, CHUNK)])
        n -= min(n, CHUNK)


def write_model(plan: ModelPlan, path: Path, seed: tuple[int, ...],
                on_bytes: Callable[[int], None] | None = None) -> int:
    """Write one GGUF atomically (via a .partial file, removed if the write fails: a full disk or
    Ctrl-C midway left gigabytes behind, one more each attempt); returns its size in bytes."""
    rng = np.random.default_rng(list(seed))
    with replaced(path, "partial") as tmp:
        align = _write_header(plan, tmp)
        pools = _Pools(rng, _Pools.sizes_for(plan.tensors, POOL_CAP))
        with open(tmp, "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(bytes(_pad(f.tell(), align) - f.tell()))
            for t in plan.tensors:
                _write_tensor(f, t, pools, rng)
                f.write(bytes(_pad(t.nbytes, align) - t.nbytes))
                if on_bytes:
                    on_bytes(_pad(t.nbytes, align))
    return path.stat().st_size


def _stamp_path(out_dir: Path, plan: PairPlan) -> Path:
    return out_dir / (plan.target_name.removesuffix(".gguf") + ".synth.json")


def _up_to_date(stamp: Path, plan: PairPlan, files: tuple[Path, Path]) -> bool:
    try:
        data = json.loads(stamp.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    sizes = data.get("sizes", {})
    return data.get("digest") == plan.digest and all(
        f.is_file() and f.stat().st_size == sizes.get(f.name) for f in files)


def write_pair(recipe: Recipe, out_dir: Path, scale: str = "tiny", seed: int = 0,
               target_type: str = "q4_k_m", draft_type: str = "q4_k") -> tuple[Path, Path]:
    """Write (or reuse) the synthetic target and drafter GGUFs; returns their paths.

    A stamp records the inputs and sizes: the same call again returns at once."""
    plan = plan_pair(recipe, scale, target_type, draft_type, seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = (out_dir / plan.target_name, out_dir / plan.drafter_name)
    stamp = _stamp_path(out_dir, plan)
    if _up_to_date(stamp, plan, files):
        return files
    _check_disk(out_dir, plan, files)
    stamp.unlink(missing_ok=True)  # a half-written pair must not look finished
    sizes = {}
    for i, (model, path) in enumerate(zip((plan.target, plan.drafter), files, strict=True)):
        sizes[path.name] = _write_with_progress(model, path, (seed, i))
    stamp.write_text(json.dumps({"digest": plan.digest, "inputs": plan.inputs, "sizes": sizes}, indent=1) + "\n")
    return files


def _check_disk(out_dir: Path, plan: PairPlan, files: tuple[Path, Path]) -> None:
    """Fail before writing when the pair cannot fit (files being replaced count as free)."""
    need = plan.target.tensor_bytes + plan.drafter.tensor_bytes + (64 << 20)  # + metadata
    free = shutil.disk_usage(out_dir).free + sum(f.stat().st_size for f in files if f.is_file())
    if need > free:
        raise BuunError(f"the synthetic pair needs {need / 1e9:.1f} GB but {out_dir} has {free / 1e9:.1f} GB free",
                        "free some space, pass another --out, or use --scale tiny", exit_code=Exit.DISK)


def _write_with_progress(model: ModelPlan, path: Path, seed: tuple[int, ...]) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    total = model.tensor_bytes
    if total < 1 << 30:
        return write_model(model, path, seed)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console.err, transient=True) as bar:
        task = bar.add_task(path.name, total=total)
        return write_model(model, path, seed, on_bytes=lambda n: bar.advance(task, n))
