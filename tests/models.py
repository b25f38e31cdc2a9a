"""The tiny synthetic model pair of the default recipe (same structure as Qwen3.5-27B + its DFlash
drafter, tiny sizes), written once and reused across test runs (write_pair is a no-op when the
files are up to date)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from buun_tool.formats import recipes
from buun_tool.measure import synth

CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "buun-models"


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[Path, Path]:
    """(target.gguf, drafter.gguf): qwen35 hybrid target (delta-net + full attention layers) and a
    dflash drafter reading several of its layers."""
    return synth.write_pair(recipes.load(), CACHE / "tiny", scale="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_pair_f32() -> tuple[Path, Path]:
    """The same pair with f32 matrices, for the correctness harness: without quantized activations,
    single-token and batched decoding agree to float rounding, so states compare tightly."""
    return synth.write_pair(recipes.load(), CACHE / "tiny-f32", scale="tiny", seed=0,
                            target_type="f32", draft_type="f32")


@pytest.fixture(scope="session")
def tiny_pair_q4_f32(tiny_pair: tuple[Path, Path], llama_bin: Path) -> tuple[Path, Path]:
    """The Q4 pair dequantized to f32 (llama-quantize ... F32): the Q4 pair's function, so its
    drafter proposes what the Q4 drafter proposes (tests/test_server_requests.py relies on the
    tokens it favours), with the f32 pair's batch invariance (tests/README.md)."""
    out = CACHE / "tiny-q4-f32"
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for src in tiny_pair:
        dest, stamp = out / src.name.replace(".gguf", "-f32.gguf"), out / (src.name + ".source")
        source = f"{src.stat().st_size} {src.stat().st_mtime_ns}\n"
        if not dest.is_file() or not stamp.is_file() or stamp.read_text() != source:
            tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")  # sessions side by side
            r = subprocess.run([str(llama_bin / "llama-quantize"), "--allow-requantize", str(src), str(tmp), "F32"],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            tmp.replace(dest)
            stamp.write_text(source)
        made.append(dest)
    return made[0], made[1]
