"""`buun synth`: shape-exact random-weight GGUFs taken from the recipe geometry."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from buun_tool.base.errors import UsageError
from buun_tool.cli.app import app
from buun_tool.formats import model_plan, recipes
from buun_tool.measure import synth
from tests.support.tiny_checkpoints import TinyModels


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def _recipe_variant(tmp_path: Path, drafter: dict | None = None, **tiny_target: int) -> recipes.Recipe:
    """The default recipe with some geometry.tiny values changed."""
    data = yaml.safe_load(recipes.available()["qwen3.5-27b-dflash"].read_text())
    data["geometry"]["tiny"]["target"].update(tiny_target)
    data["geometry"]["tiny"]["drafter"].update(drafter or {})
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return recipes.load_file(path)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[recipes.Recipe, gguf.GGUFReader, gguf.GGUFReader]:
    """The tiny geometry with a 4096-token vocabulary: gguf-py reads a 248k-token vocabulary slowly."""
    tmp = tmp_path_factory.mktemp("small")
    r = _recipe_variant(tmp, {"mask_token_id": 3846}, vocab_size=4096, eos_token_id=3820)
    target, drafter = synth.write_pair(r, tmp / "models")
    return r, gguf.GGUFReader(target), gguf.GGUFReader(drafter)


class TestFiles:
    def test_tensors_match_the_plan_exactly(self, small) -> None:
        r, target, drafter = small
        plan = model_plan.plan_pair(r, "tiny")
        for reader, model in zip((target, drafter), (plan.target, plan.drafter), strict=True):
            got = [(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type)) for t in reader.tensors]
            want = [(t.name, t.ne, int(t.qtype)) for t in model.tensors]
            assert got == want

    def test_metadata_follows_the_recipe(self, small) -> None:
        r, target, drafter = small
        geo = r.geometry_at("tiny")
        assert _field(target, "general.architecture") == "qwen35"
        assert _field(target, "qwen35.block_count") == geo.target.num_hidden_layers
        assert _field(target, "qwen35.embedding_length") == geo.target.hidden_size
        assert _field(target, "qwen35.ssm.time_step_rank") == geo.target.linear_num_value_heads
        assert _field(drafter, "general.architecture") == "dflash"
        # upstream stores HF target_layer_ids + 1 (the loader reads layer inputs)
        assert _field(drafter, "dflash.target_layers") == [i + 1 for i in geo.drafter.target_layer_ids]
        assert _field(drafter, "dflash.block_size") == geo.drafter.block_size
        assert _field(drafter, "tokenizer.ggml.mask_token_id") == geo.drafter.mask_token_id
        assert "token_embd.weight" not in {t.name for t in drafter.tensors}

    def test_special_tokens_follow_the_recipe_ids(self, small) -> None:
        _, target, drafter = small
        tokens = _field(drafter, "tokenizer.ggml.tokens")
        assert len(tokens) == 4096
        assert (tokens[3820], tokens[3821], tokens[3822], tokens[3846]) == (
            "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
        assert _field(target, "tokenizer.ggml.eos_token_id") == 3822
        assert "<|im_start|>" in _field(target, "tokenizer.chat_template")

    def test_real_qwen_special_ids_in_the_recipe_vocabulary(self) -> None:
        geo = recipes.load().geometry_at("tiny")
        v = model_plan.build_vocab(geo.target.vocab_size, geo.target.eos_token_id, geo.drafter.mask_token_id)
        assert (v.tokens[248044], v.tokens[248045], v.tokens[248046], v.tokens[248070]) == (
            "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
        assert len(v.tokens) == len(set(v.tokens)) == 248320

    def test_quant_blocks_are_finite_and_scaled(self, small) -> None:
        reader = small[1]
        seen = set()
        for t in reader.tensors:
            qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
            if qtype == gguf.GGMLQuantizationType.F32 or qtype in seen or t.name == "output.weight":
                continue
            seen.add(qtype)
            w = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(-1)
            assert np.isfinite(w).all(), t.name
            n_in = int(t.shape[0])
            assert 0.5 / math.sqrt(n_in) < float(w.std()) < 2.0 / math.sqrt(n_in), (t.name, qtype.name)
        assert {gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K,
                gguf.GGMLQuantizationType.Q6_K} <= seen

    def test_special_token_rows_of_the_head_are_zero(self, small) -> None:
        head = next(t for t in small[1].tensors if t.name == "output.weight")
        w = gguf.quants.dequantize(np.asarray(head.data), gguf.GGMLQuantizationType(int(head.tensor_type)))
        assert not w[3820:].any() and w[:3820].any(axis=1).all()


    def test_no_two_head_rows_repeat_when_the_pool_wraps(self, tmp_path: Path, monkeypatch) -> None:
        # identical lm_head rows give identical logits: exact argmax ties that batched and
        # single-token decoding break differently
        monkeypatch.setattr(synth, "POOL_CAP", 64 * 210)  # 64 Q6_K blocks for 3820 one-block rows
        r = _recipe_variant(tmp_path, {"mask_token_id": 3846}, vocab_size=4096, eos_token_id=3820)
        head = next(t for t in gguf.GGUFReader(synth.write_pair(r, tmp_path / "m")[0]).tensors
                    if t.name == "output.weight")
        rows = np.asarray(head.data).reshape(4096, -1)[:3820]
        assert len(np.unique(rows, axis=0)) == 3820


class TestWritePair:
    def test_same_seed_same_bytes_other_seed_other_bytes(self, tmp_path: Path) -> None:
        r = recipes.load()
        a = synth.write_pair(r, tmp_path / "a", seed=7)
        b = synth.write_pair(r, tmp_path / "b", seed=7)
        c = synth.write_pair(r, tmp_path / "c", seed=8)
        assert [_sha(p) for p in a] == [_sha(p) for p in b]
        assert _sha(a[0]) != _sha(c[0]) and _sha(a[1]) != _sha(c[1])

    def test_second_call_is_a_no_op_and_other_inputs_rewrite(self, tmp_path: Path) -> None:
        r = recipes.load()
        first = synth.write_pair(r, tmp_path, draft_type="q8_0")
        mtimes = [p.stat().st_mtime_ns for p in first]
        assert synth.write_pair(r, tmp_path, draft_type="q8_0") == first
        assert [p.stat().st_mtime_ns for p in first] == mtimes
        synth.write_pair(r, tmp_path, draft_type="q8_0", seed=1)  # same names, new inputs
        assert first[0].stat().st_mtime_ns != mtimes[0]
        stamp = json.loads(next(tmp_path.glob("*.synth.json")).read_text())
        assert stamp["inputs"]["seed"] == 1

    def test_a_truncated_file_is_written_again(self, tmp_path: Path) -> None:
        r = recipes.load()
        target, _ = synth.write_pair(r, tmp_path)
        good = _sha(target)
        with open(target, "r+b") as fh:
            fh.truncate(1000)
        assert _sha(synth.write_pair(r, tmp_path)[0]) == good


class TestGeometry:
    def test_changing_the_recipe_changes_the_shapes(self, tmp_path: Path) -> None:
        base = model_plan.plan_pair(recipes.load(), "tiny")
        variant = model_plan.plan_pair(_recipe_variant(tmp_path, intermediate_size=768, num_hidden_layers=12), "tiny")
        shapes = {t.name: t.ne for t in variant.target.tensors}
        assert shapes["blk.0.ffn_up.weight"] == (256, 768)
        assert "blk.11.ffn_up.weight" in shapes and "blk.11.ffn_up.weight" not in {t.name for t in base.target.tensors}
        # the full-attention layers follow full_attention_interval: 3, 7, 11
        assert [n for n in shapes if n.endswith("attn_q.weight")] == [f"blk.{i}.attn_q.weight" for i in (3, 7, 11)]

    def test_full_scale_is_the_27b_pair(self) -> None:
        plan = model_plan.plan_pair(recipes.load(), "full")
        shapes = {t.name: t.ne for t in plan.target.tensors}
        assert shapes["blk.3.attn_q.weight"] == (5120, 2 * 24 * 256)  # query + output gate
        assert shapes["blk.0.attn_qkv.weight"] == (5120, 2 * 16 * 128 + 48 * 128)
        assert 16.0e9 < plan.target.tensor_bytes < 17.0e9  # Q4_K_M mix of 27 B parameters
        assert 0.9e9 < plan.drafter.tensor_bytes < 1.05e9
        assert {t.name: t.ne for t in plan.drafter.tensors}["fc.weight"] == (5 * 5120, 5120)

    def test_mismatched_hidden_sizes_are_refused_when_the_recipe_loads(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError, match=r"geometry\.tiny\.drafter\.hidden_size: expected geometry\.tiny\.target"):
            _recipe_variant(tmp_path, hidden_size=512)

    def test_unknown_type_names_the_valid_ones(self) -> None:
        with pytest.raises(UsageError, match="q4_k_m"):
            model_plan.plan_pair(recipes.load(), "tiny", target_type="q3_k")


class TestCli:
    def test_dry_run_reports_sizes_and_writes_nothing(self, tmp_path: Path) -> None:
        res = CliRunner().invoke(app, ["synth", "--scale", "full", "--dry-run", "--json", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        info = json.loads(res.stdout)
        assert info["target"]["arch"] == "qwen35" and info["drafter"]["tensors"] == 58
        assert list(tmp_path.iterdir()) == []

    def test_writes_into_the_models_folder_by_default(self, tmp_path: Path) -> None:
        res = CliRunner().invoke(app, ["synth", "--scale", "tiny", "--models-dir", str(tmp_path), "--json"])
        assert res.exit_code == 0, res.output
        files = json.loads(res.stdout)["files"]
        assert Path(files["target"]).parent == tmp_path / "synthetic" and Path(files["drafter"]).is_file()

    def test_writes_the_pair(self, tmp_path: Path) -> None:
        res = CliRunner().invoke(app, ["synth", "--scale", "tiny", "--out", str(tmp_path), "--json"])
        assert res.exit_code == 0, res.output
        files = json.loads(res.stdout)["files"]
        assert Path(files["target"]).is_file() and Path(files["drafter"]).is_file()


def test_an_out_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    """Any command, any path it cannot use as given: a message and exit 2, not a traceback."""
    f = tmp_path / "file"
    f.write_text("mine")
    res = CliRunner().invoke(app, ["synth", "--scale", "tiny", "--out", str(f)])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2 and f"cannot use {f}: File exists (a file is there where a folder must be)" in flat
    assert "give another path or fix this one" in flat and isinstance(res.exception, SystemExit)
    res = CliRunner().invoke(app, ["synth", "--scale", "tiny", "--out", str(f / "below")])
    assert res.exit_code == 2 and "where a folder must be" in " ".join(res.output.split())
    assert f.read_text() == "mine"


def test_a_negative_seed_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", "--scale", "tiny", "--out", str(tmp_path), "--seed", "-1"])
    assert res.exit_code == 2 and "--seed -1: expected 0 or more" in res.output
    assert list(tmp_path.iterdir()) == []


def test_a_write_past_the_file_size_limit_leaves_no_partial_file(tmp_path: Path) -> None:
    """`ulimit -f` (or FAT32's 4 GiB) stops the target midway: one line and exit 7, and no
    gigabytes of .partial left behind for each attempt."""
    import resource
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    res = subprocess.run([sys.executable, "-m", "buun_tool", "synth", "--scale", "tiny", "--out", str(tmp_path)],
                         preexec_fn=limit, capture_output=True, text=True, timeout=60)
    assert res.returncode == 7, res.stderr
    assert "Traceback" not in res.stderr and "file-size limit (`ulimit -f`)" in " ".join(res.stderr.split())
    assert list(tmp_path.iterdir()) == []


def test_is_synthetic_tells_buun_synths_models(tiny_pair: tuple[Path, Path], tiny_models_built: TinyModels,
                                                tmp_path: Path) -> None:
    """What `buun bench --tree-budget` feigns acceptance for: random weights buun synth wrote."""
    assert all(model_plan.is_synthetic(p) for p in tiny_pair)
    assert not model_plan.is_synthetic(tiny_models_built.target_gguf)  # converted from a checkpoint, as a real one
    (tmp_path / "x.gguf").write_bytes(b"GGUF, and then not")
    assert not model_plan.is_synthetic(tmp_path / "x.gguf") and not model_plan.is_synthetic(tmp_path / "missing.gguf")


@pytest.mark.slow
class TestLlamaCpp:
    def test_llama_bench_runs_the_tiny_target(self, tiny_pair: tuple[Path, Path], llama_bin: Path) -> None:
        # --repack 0: the CPU build's AMX repack kernels fault on this kind of machine
        out = subprocess.run([str(llama_bin / "llama-bench"), "-m", str(tiny_pair[0]), "-p", "16", "-n", "4",
                              "-r", "1", "--repack", "0", "-o", "json"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = json.loads(out.stdout)
        assert {r["n_prompt"] for r in rows} == {16, 0} and all(r["avg_ts"] > 0 for r in rows)
        assert "qwen35" in rows[0]["model_type"]
