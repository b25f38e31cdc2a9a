"""The tiny synthetic model pair of the default recipe (same structure as Qwen3.5-27B + its DFlash
drafter, tiny sizes), written once and reused across test runs (write_pair is a no-op when the
files are up to date)."""

from __future__ import annotations

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
