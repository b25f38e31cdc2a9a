"""DFlash2 through the series, on the CPU build: the tiny pair of recipes/qwen3.8-27b-dflash2.yaml
(the qwen35 target and a DFlash2 drafter with its convolutions, top-k selector and window, f32).

The checks of tests/test_correctness.py, for the second drafter: greedy generation gives AR's tokens
(one slot, and two slots verifying in one batch); after steps with partial acceptance, on a chain
and on a tree built from the selector's candidates (patch 0022), the target's state is the state
of decoding the same tokens from scratch. The drafter's block of 8 gives verify batches of 8 rows.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml
from typer.testing import CliRunner

from buun_tool.base import paths
from buun_tool.cli.app import app
from buun_tool.formats import layout, recipes
from buun_tool.formats.gguf_tools import GgufFile
from buun_tool.server import control
from buun_tool.server.instance import all_instances
from buun_tool.server.process import free_port
from tests.support import tiny_checkpoints
from tests.support.fake_hub import FakeHub
from tests.support.fixtures_models import DFLASH2_RECIPE
from tests.support.real_llama_server import Server, gpu_layers, llama_server
from tests.support.tiny_checkpoints import TinyModels
from tests.test_correctness import (
    EXACT,
    PROMPTS,
    TREE,
    _assert_state_within_noise,
    _base,
    _branches_taken,
    _greedy_matches,
    _rollback_diffs,
    _spec_stats,
    _tie_tol,
)
from tests.test_setup import run_setup

pytestmark = pytest.mark.slow

N_GEN = 64
DFLASH2 = ["--spec-type", "dflash", "--draft-max", "7", "--draft-min", "1", "-b", "256", "-ub", "64"]
TINY = recipes.load(DFLASH2_RECIPE).geometry_at("tiny").drafter
# what the speculative implementation logs of the drafter it loaded: DFlash2's block and mask
LOADED = f"block_size={TINY.block_size}, mask_token_id={TINY.mask_token_id}"


# Two slots' prompts that span ubatches (70 and 131 tokens, -ub 64), started together after a request:
# the case of patch 0011's stale replay (journal section 51)
LONG = [[1000 + (37 * i + 7 * k) % 4000 for i in range(70 + 61 * k)] for k in range(2)]


def _dflash2(pair: tuple[Path, Path], *extra: str, slots: int = 1) -> list[str]:
    target, draft = pair
    return ["-m", str(target), "-np", str(slots), "-c", str(2048 * slots), *gpu_layers(), "-md", str(draft),
            *DFLASH2, *extra]


@pytest.fixture(scope="module")
def ar_exact(llama_bin: Path, tiny_dflash2_pair_f32: tuple[Path, Path],
             tmp_path_factory: pytest.TempPathFactory):
    with llama_server(llama_bin, _base(tiny_dflash2_pair_f32[0], *EXACT),
                      tmp_path_factory.mktemp("ar-exact") / "log") as s:
        yield s


def test_the_dflash2_drafter_gives_ars_tokens_on_one_and_two_slots(
        ar_exact: Server, llama_bin: Path, tiny_dflash2_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    """A request alone, then two at once: both slots' blocks go through the drafter in one decode
    and their verifies through the target in one batch."""
    log = tmp_path / "dflash2.log"
    prompts = [PROMPTS[2], *LONG]
    with llama_server(llama_bin, _dflash2(tiny_dflash2_pair_f32, *EXACT, slots=2), log) as spec:
        alone = spec.complete(prompts[0], N_GEN)
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda p: spec.complete(p, N_GEN), LONG))
    assert LOADED in log.read_text(errors="replace"), "the drafter was not loaded with its block of 8"
    for prompt, got in zip(prompts, [alone, *together], strict=True):
        assert len(got["tokens"]) == N_GEN
        _greedy_matches(ar_exact, prompt, got["tokens"], _tie_tol())  # on the CPU: AR's tokens exactly
        assert _spec_stats(got)[0] > 0, "no draft was verified"


@pytest.mark.parametrize("synth", [["--spec-synth-len", "3"], TREE], ids=["chain-3", "tree-22"])
def test_the_state_after_dflash2_steps_is_decoding_from_scratch(llama_bin: Path,
                                                                 tiny_dflash2_pair_f32: tuple[Path, Path],
                                                                 tmp_path: Path, synth: list[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As tests/test_correctness.py's rollback check: the next-token log-probabilities after the
    committed tokens, on the speculative server's cached state against a fresh decode, within a
    few times the noise of AR decoding the same tokens one at a time and in chunks. The tree is
    built from the selector's candidates: the trace must show steps that took a branch."""
    monkeypatch.setenv("LLAMA_TRACE", "1")
    target, _ = tiny_dflash2_pair_f32
    with (llama_server(llama_bin, _base(target, "-fa", "on", "-ctxcp", "0"), tmp_path / "ar.log") as ar,
          llama_server(llama_bin, _dflash2(tiny_dflash2_pair_f32, "-fa", "on", *synth), tmp_path / "spec.log") as spec):
        _assert_state_within_noise([_rollback_diffs(ar, spec, PROMPTS[1], N_GEN)])
    if synth is TREE:
        assert _branches_taken(tmp_path / "spec.log") > 0, "no step accepted a branch off the selector's walk"


# --- the recipe end to end ------------------------------------------------------------------------

TARGET2, DRAFTER2, TOKENIZER2 = "unsloth/Qwen3.8-27B-GGUF", "z-lab/Qwen3.8-27B-DFlash2", "Qwen/Qwen3.8-27B"


@pytest.fixture
def dflash2_recipe_file(fake_hub: FakeHub, tiny_models_built: TinyModels, tmp_path: Path) -> Path:
    """The DFlash2 recipe's repos on the fake Hub: the tiny qwen35 target, a tiny DFlash2 checkpoint
    (the recipe's tiny drafter, with the real tokenizer's mask token and a selector rank of 32 to keep
    its two vocabulary-sized codebooks small) and the real tokenizer; a recipe file pulling them."""
    geo = {**recipes.load(DFLASH2_RECIPE).geometry_at("tiny").to_json()["drafter"],
           "mask_token_id": tiny_models_built.geometry["drafter"]["mask_token_id"], "selector_rank": 32}
    cfg = tiny_checkpoints.drafter_config(geo, tiny_models_built.geometry["target"])
    tiny_checkpoints.write_checkpoint(tmp_path / "drafter2", cfg, tiny_checkpoints.drafter2_weights(cfg))
    gguf_name = "Qwen3.8-27B-tiny-Q8_0.gguf"
    fake_hub.add_repo(TARGET2, {gguf_name: tiny_models_built.target_gguf})
    fake_hub.add_repo(DRAFTER2, {n: tmp_path / "drafter2" / n for n in ("config.json", "model.safetensors")})
    fake_hub.add_repo(TOKENIZER2, {p.name: p for p in sorted(tiny_models_built.tokenizer_dir.iterdir())})
    data = yaml.safe_load(recipes.load(DFLASH2_RECIPE).source.read_text())
    data["target"]["gguf"] = gguf_name
    data["expect"] = tiny_checkpoints.expect_block(geo)
    data["geometry"] = tiny_checkpoints.tiny_as_full(data, recipes.load(DFLASH2_RECIPE))
    path = tmp_path / f"{DFLASH2_RECIPE}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_setup_of_the_dflash2_recipe_serves_its_drafter(dflash2_recipe_file: Path, llama_bin: Path) -> None:
    """`buun setup` of the DFlash2 recipe on the local Hub: the drafter is converted by the pinned
    converter (`DFlash2DraftModel`), quantized to the recipe's Q4_K_M with its convolutions' base
    kernels left f32, checked (the selector and every DFlash2 tensor) and served; converting it
    again gives the same bytes."""
    port = free_port()
    try:
        done = run_setup(dflash2_recipe_file, port)
        assert done.returncode == 0, done.stderr[-3000:]
        r = requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "def f(x):", "n_predict": 8},
                          timeout=120)
        assert r.status_code == 200 and r.json()["timings"]["draft_n"] > 0
    finally:
        for inst in all_instances():
            control.stop(inst, 10)
    recipe = recipes.load_file(dflash2_recipe_file)
    gguf = layout.for_recipe(recipe, paths.models_dir()).drafter_gguf()
    with GgufFile(gguf) as f:
        assert f.get("dflash.selector_top_k") == 8 and f.get("dflash.block_size") == 8
        types = {t.name: t.ggml_type.name for t in f.tensors}
    assert types["selector_hidden.weight"] not in ("F32", "F16", "BF16")
    assert types["blk.0.attn_conv_base"] == "F32" and types["blk.1.ffn_conv_proj.weight"] == "Q4_K"
    first = hashlib.sha256(gguf.read_bytes()).hexdigest()
    again = subprocess.run([sys.executable, "-m", "buun_tool", "convert", str(dflash2_recipe_file),
                            "--force"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == first, "a second conversion gave other bytes"


def test_buun_tune_measures_the_dflash2_recipe(tiny_dflash2_pair_f32: tuple[Path, Path], llama_bin: Path) -> None:
    """`buun tune qwen3.8-27b-dflash2` plans from the recipe's draft length (7, block 8): AR and the
    chain of 7 always run; with a 1 s budget the trees and the shorter chain are cut and named; the
    pick is kept for this recipe, beside its evidence."""
    target, drafter = tiny_dflash2_pair_f32
    res = CliRunner().invoke(app, ["tune", DFLASH2_RECIPE, "--target", str(target), "--drafter", str(drafter),
                                   "--prompts", "1", "--n-predict", "32", "--tree-profile", "1:0",
                                   "--budget-s", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["config"] for r in out["measured"]] == ["ar", "dflash-chain7"]
    assert out["cut"] == ["tree budget 15", "tree budget 22", "chain of 4"]
    assert out["tuned"]["key"]["recipe"] == DFLASH2_RECIPE and Path(out["files"]["bench"]).is_file()
