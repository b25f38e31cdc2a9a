"""`buun gguf inspect` and `buun gguf migrate`.

The reader is checked against gguf-py's own on a file gguf-py wrote. `migrate` is checked on a
drafter in the buun fork's format that the test writes with gguf-py from the tiny HF drafter
(the fork's names and keys): the result must equal, key for key and byte for byte, what
upstream's converter makes of the same checkpoint, and load in the real llama-server.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from buun_tool.base.errors import Exit, UsageError
from buun_tool.cli.app import app
from buun_tool.formats import gguf_tools
from tests.support.real_llama_server import llama_server
from tests.support.tiny_checkpoints import TinyModels

T = gguf.GGUFValueType


# --- a small file written by gguf-py ------------------------------------------------------

@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float64("llama.some_double", 0.125)
    w.add_int8("llama.small", -3)
    w.add_uint64("llama.big", 2**40)
    w.add_bool("llama.flag", True)
    w.add_string("general.name", "Smäll ✓")
    w.add_array("llama.layers", [1, 2, 3])
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)])
    w.add_key_value("llama.scales", [0.5, 1.5], T.ARRAY, sub_type=T.FLOAT32)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((40, 64), dtype=np.float32).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.add_tensor("blk.1.attn_norm.weight", np.ones(64, dtype=np.float32) * 2)
    q8 = gguf.quants.quantize(rng.standard_normal((8, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class TestReader:
    def test_reads_what_gguf_py_reads(self, small_gguf: Path):
        ref = gguf.GGUFReader(small_gguf)
        with gguf_tools.GgufFile(small_gguf) as f:
            assert [k for k in ref.fields if not k.startswith("GGUF.")] == list(f.kv)
            for key, kv in f.kv.items():
                field = ref.fields[key]
                assert kv.vtype == field.types[0]
                expect = field.contents()
                assert kv.value == (pytest.approx(expect) if isinstance(expect, float) else expect)
            assert [t.name for t in f.tensors] == [t.name for t in ref.tensors]
            for mine, theirs in zip(f.tensors, ref.tensors, strict=True):
                assert mine.ggml_type == theirs.tensor_type
                assert list(mine.dims) == [int(d) for d in theirs.shape]
                assert mine.nbytes == theirs.n_bytes
                assert b"".join(f.tensor_bytes(mine)) == theirs.data.tobytes()

    def test_rewriting_every_key_and_tensor_raw_gives_the_same_bytes(self, small_gguf: Path, tmp_path: Path):
        out = tmp_path / "copy.gguf"
        with gguf_tools.GgufFile(small_gguf) as f:
            gguf_tools.write_gguf(out, [(k, kv.raw()) for k, kv in f.kv.items()],
                                  [(t.name, f, t) for t in f.tensors], f.alignment)
        assert out.read_bytes() == small_gguf.read_bytes()

    def test_encode_value_matches_gguf_py(self, small_gguf: Path):
        with gguf_tools.GgufFile(small_gguf) as f:
            for key, kv in f.kv.items():
                assert gguf_tools.encode_value(kv.vtype, kv.value, kv.sub) == kv.raw(), key

    def test_truncated_file_is_refused(self, small_gguf: Path, tmp_path: Path):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(small_gguf.read_bytes()[:-100])
        with pytest.raises(UsageError, match="runs past the end of the file"):
            gguf_tools.GgufFile(cut)

    def test_not_a_gguf(self, tmp_path: Path):
        junk = tmp_path / "junk.gguf"
        junk.write_bytes(b"PK\x03\x04" + b"\0" * 100)
        with pytest.raises(UsageError, match="not a readable GGUF file"):
            gguf_tools.GgufFile(junk)

    @pytest.mark.parametrize(("key", "value", "patch", "why"), [
        # patch: (bytes to find, how far past them, struct format, values written there)
        ("general.alignment", 32, (b"general.alignment", 4, "<I", 0), "general.alignment is 0, not a power of two"),
        ("general.alignment", 32, (b"general.alignment", 4, "<I", 24), "general.alignment is 24, not a power of two"),
        ("general.alignment", [32], None, "general.alignment has type array, not uint32"),
        ("llama.layers", [1, 2], (b"llama.layers", 4, "<I", int(T.ARRAY)), "nested GGUF arrays are not supported"),
        ("general.name", "tiny", (b"general.name", 4, "<Q", 2**40), "a string of 1099511627776 bytes at offset"),
        (None, None, (b"token_embd.weight", 4, "<QQ", 2**40, 2**40), "has an impossible shape"),
        (None, None, (b"token_embd.weight", 0, "<I", 5), "token_embd.weight has 5 dimensions (at most 4)"),
        (None, None, (b"GGUF", 0, "<I", 1), "GGUF version 1; llama.cpp reads versions 2 and 3"),
        # a declared count is checked against the bytes left before anything loops over it, and named
        ("tokenizer.ggml.tokens", ["a", "b"], (b"tokenizer.ggml.tokens", 8, "<Q", 2**40),
         "tokenizer.ggml.tokens: an array of 1099511627776 string items, more than the"),
        ("llama.layers", [1, 2], (b"llama.layers", 8, "<Q", 2**40), "llama.layers: an array of 1099511627776 "),
        (None, None, (b"GGUF", 4, "<Q", 2**40),
         "the header's key count 1 and tensor count 1099511627776 are more than the file's"),
    ])
    def test_nonsense_in_the_header_is_refused(self, tmp_path: Path, key: str | None, value: Any,
                                               patch: tuple[Any, ...] | None, why: str):
        """A file from the Hub is anyone's: a header value no writer makes (an alignment of 0, a
        string longer than the file, a shape that overflows) is a clear refusal naming the file,
        never a ZeroDivisionError, a made-up value or a tensor of 0 bytes."""
        path = tmp_path / "odd.gguf"
        w = gguf.GGUFWriter(path, "llama")
        if key is not None:
            w.add_key_value(key, value, T.ARRAY if isinstance(value, list) else
                            T.STRING if isinstance(value, str) else T.UINT32)
        w.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if patch is not None:
            marker, skip, fmt, *values = patch
            data = bytearray(path.read_bytes())
            struct.pack_into(fmt, data, data.index(marker) + len(marker) + skip, *values)
            path.write_bytes(bytes(data))
        with pytest.raises(UsageError, match="not a readable GGUF file") as exc:
            gguf_tools.GgufFile(path)
        assert why in exc.value.message and str(path) in exc.value.message
        assert exc.value.hint and "buun pull --verify" in exc.value.hint
        res = CliRunner().invoke(app, ["gguf", "inspect", str(path)])
        assert res.exit_code == Exit.USAGE and why in " ".join(res.output.split()), res.output


    def test_a_count_past_the_file_is_refused_without_reading_on(self, tmp_path: Path):
        """A vocabulary whose count is damaged, in a large file: the reader walked the rest of the file
        string by string (minutes for a 16 GB target, 8 s for 400 MB of zeros) before its error, which
        did not name the key."""
        path = tmp_path / "big.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_array("tokenizer.ggml.tokens", ["a", "b"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        data = bytearray(path.read_bytes())
        struct.pack_into("<Q", data, data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8, 2**40)
        path.write_bytes(bytes(data))
        with open(path, "r+b") as fh:
            fh.truncate(2**30)  # 1 GiB of zeros, sparse: strings of length 0 to a reader that walks them
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="tokenizer.ggml.tokens: an array of 1099511627776 string items"):
            gguf_tools.GgufFile(path)
        assert time.monotonic() - t0 < 2


class TestInspect:
    def test_summary(self, small_gguf: Path):
        info = gguf_tools.inspect(small_gguf)
        assert info["architecture"] == "llama" and info["version"] == 3
        assert info["general"]["name"] == "Smäll ✓"
        assert info["hparams"]["block_count"] == 2 and info["hparams"]["layers"] == [1, 2, 3]
        assert info["tokenizer"]["ggml.tokens"] == "[40 x string]"  # long arrays are summarised
        t = info["tensors"]
        assert t["count"] == 4 and t["layers"] == 2
        assert t["global"] == ["output.weight", "token_embd.weight"]
        assert t["per_layer"] == {"attn_norm.weight": 2}
        assert t["by_type"]["Q8_0"] == {"count": 1, "bytes": 8 * 64 // 32 * 34}
        assert t["by_type"]["F16"]["bytes"] == 40 * 64 * 2
        assert t["parameters"] == 40 * 64 + 2 * 64 + 8 * 64

    def test_cli_json_and_table(self, small_gguf: Path):
        res = CliRunner().invoke(app, ["gguf", "inspect", str(small_gguf), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["tensors"]["count"] == 4
        res = CliRunner().invoke(app, ["gguf", "inspect", str(small_gguf)])
        assert res.exit_code == 0 and "architecture: llama" in res.stdout and "Q8_0" in res.stdout

    def test_cli_shows_the_files_strings_literally(self, tmp_path: Path):
        """A GGUF's strings are its author's (a file from the Hub): the table shows them as written,
        not read as rich markup (a stray closing tag crashed the command, `[link=...]` made a link)
        and without sending control characters to the terminal."""
        path = tmp_path / "strange.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_string("general.name", "[/bold] [red]spoof")
        w.add_string("llama.note", "[link=https://example.invalid]safe[/link] \x1b]0;owned\x1b\\")
        w.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        res = CliRunner().invoke(app, ["gguf", "inspect", str(path)])
        assert res.exit_code == 0, res.output
        assert "name: [/bold] [red]spoof" in res.stdout
        assert "[link=https://example.invalid]safe[/link] \\x1b]0;owned\\x1b\\" in res.stdout
        assert "\x1b" not in res.stdout

    def test_cli_missing_file(self, tmp_path: Path):
        res = CliRunner().invoke(app, ["gguf", "inspect", str(tmp_path / "none.gguf")])
        assert res.exit_code == Exit.USAGE and "does not exist" in " ".join(res.output.split())

    def test_cli_a_device_or_a_pipe(self, tmp_path: Path):
        """Neither "does not exist" (it does) nor a read of a FIFO that waits for a writer forever."""
        import os

        fifo = tmp_path / "pipe.gguf"
        os.mkfifo(fifo)
        for path in (Path("/dev/null"), fifo):
            res = CliRunner().invoke(app, ["gguf", "inspect", str(path)])
            assert res.exit_code == Exit.USAGE and f"{path} is a device or a pipe, not a GGUF file" in res.output

    def test_cli_a_file_shorter_than_a_header(self, tmp_path: Path):
        short = tmp_path / "short.gguf"
        short.write_bytes(b"GGUF\x03")
        res = CliRunner().invoke(app, ["gguf", "inspect", str(short)])
        assert res.exit_code == Exit.USAGE and "5 bytes, shorter than a GGUF header" in res.output

    def test_cli_a_folder(self, tmp_path: Path):
        """A folder is not "a file that does not exist"."""
        res = CliRunner().invoke(app, ["gguf", "inspect", str(tmp_path)])
        assert res.exit_code == Exit.USAGE and res.stderr == (f"error: {tmp_path} is a folder, not a GGUF file\n"
                                                              "hint: pass the path of a .gguf file in it\n")


# --- a drafter in the buun fork's format ----------------------------------------------------

def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """BF16 safetensors -> float32 arrays (BF16 is the upper half of a float32)."""
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        start, end = h["data_offsets"]
        bits = np.frombuffer(raw, dtype=np.uint16, count=(end - start) // 2, offset=8 + n + start)
        out[name] = (bits.astype(np.uint32) << 16).view(np.float32).reshape(h["shape"])
    return out


_FORK_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def _fork_name(hf: str) -> str:
    if hf.startswith("layers."):
        _, i, rest = hf.split(".", 2)
        return f"blk.{i}.{_FORK_NAMES[rest.removesuffix('.weight')]}.weight"
    return {"fc.weight": "dflash_fc.weight", "hidden_norm.weight": "dflash_hidden_norm.weight",
            "norm.weight": "output_norm.weight"}[hf]


def write_fork_drafter(drafter_dir: Path, out: Path, *, rope_dims: bool = False,
                       extra_tensor: str | None = None) -> Path:
    """What the fork's converter writes for a z-lab drafter: arch `dflash-draft`, its keys and
    tensor names, F16 matrices and F32 vectors, no vocabulary."""
    cfg = json.loads((drafter_dir / "config.json").read_text())
    ids = cfg["dflash_config"]["target_layer_ids"]
    a = "dflash-draft"
    w = gguf.GGUFWriter(out, a)
    w.add_string("general.name", "Qwen3.5-27B-DFlash")
    w.add_uint32(f"{a}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{a}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{a}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{a}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{a}.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(f"{a}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_float32(f"{a}.rope.freq_base", cfg["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_uint32(f"{a}.attention.key_length", cfg["head_dim"])
    w.add_uint32(f"{a}.attention.value_length", cfg["head_dim"])
    if rope_dims:
        w.add_uint32(f"{a}.rope.dimension_count", cfg["head_dim"])
    w.add_uint32("general.file_type", 1)
    w.add_uint32(f"{a}.dflash.block_size", cfg["block_size"])
    w.add_uint32(f"{a}.dflash.mask_token_id", cfg["dflash_config"]["mask_token_id"])
    w.add_key_value(f"{a}.dflash.target_layer_ids", ids, T.ARRAY, sub_type=T.INT32)
    w.add_uint32(f"{a}.dflash.n_target_features", len(ids) * cfg["hidden_size"])
    w.add_uint32("general.quantization_version", 2)
    for name, data in _read_safetensors(drafter_dir / "model.safetensors").items():
        w.add_tensor(_fork_name(name), data.astype(np.float16 if data.ndim == 2 else np.float32))
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture
def fork_file(tiny_models_built: TinyModels, tmp_path: Path) -> Path:
    return write_fork_drafter(tiny_models_built.drafter_dir, tmp_path / "fork.gguf")


def _keys(f: gguf_tools.GgufFile, prefixes: tuple[str, ...]) -> dict[str, bytes]:
    return {k: kv.raw() for k, kv in f.kv.items() if k.startswith(prefixes)}


class TestMigrate:
    def test_matches_what_upstreams_converter_writes(self, tiny_models_built: TinyModels, fork_file: Path,
                                                     tmp_path: Path):
        out = tmp_path / "migrated.gguf"
        report = gguf_tools.migrate(fork_file, out, tiny_models_built.target_gguf)
        assert report["vocabulary_from"] == str(tiny_models_built.target_gguf)
        assert report["added"] == ["dflash.rope.dimension_sections"]
        assert report["dropped"] == ["dflash-draft.dflash.n_target_features"]
        assert report["renamed_tensors"]["dflash_fc.weight"] == "fc.weight"
        assert report["renamed_tensors"]["blk.1.post_attention_norm.weight"] == "blk.1.ffn_norm.weight"
        with gguf_tools.GgufFile(out) as got, gguf_tools.GgufFile(tiny_models_built.upstream_drafter_f16) as ref:
            assert got.architecture == "dflash"
            assert _keys(got, ("dflash.", "tokenizer.")) == _keys(ref, ("dflash.", "tokenizer."))
            assert got.get("dflash.target_layers") == [2, 4, 6]  # layer ids + 1
            assert got.get("tokenizer.ggml.mask_token_id") == 248070
            mine = {t.name: (t.ggml_type, t.dims, b"".join(got.tensor_bytes(t))) for t in got.tensors}
            theirs = {t.name: (t.ggml_type, t.dims, b"".join(ref.tensor_bytes(t))) for t in ref.tensors}
            assert mine == theirs

    def test_no_vocabulary_and_no_target(self, fork_file: Path, tmp_path: Path):
        with pytest.raises(UsageError) as info:
            gguf_tools.migrate(fork_file, tmp_path / "out.gguf", mrope=True)
        assert "has no vocabulary" in info.value.message and "--target" in (info.value.hint or "")
        assert not (tmp_path / "out.gguf").exists()
        assert list(tmp_path.glob(".*partial")) == []

    def test_mrope_is_read_from_the_target_or_given(self, tiny_models_built: TinyModels, tmp_path: Path):
        fork = write_fork_drafter(tiny_models_built.drafter_dir, tmp_path / "fork.gguf", rope_dims=True)
        gguf_tools.migrate(fork, tmp_path / "no.gguf", tiny_models_built.target_gguf, mrope=False)
        with gguf_tools.GgufFile(tmp_path / "no.gguf") as f:
            assert "dflash.rope.dimension_sections" not in f.kv
        gguf_tools.migrate(fork, tmp_path / "yes.gguf", tiny_models_built.target_gguf)
        with gguf_tools.GgufFile(tmp_path / "yes.gguf") as f:
            assert f.get("dflash.rope.dimension_sections") == [64, 0, 0, 0]  # rope dims 128 / 2

    @pytest.mark.parametrize(("key", "vtype", "value", "why"), [
        ("dflash-draft.embedding_length", T.STRING, "abc", "must be an integer >= 1; it is 'abc'"),
        ("dflash-draft.embedding_length", None, None, "must be an integer >= 1; it is missing"),
        ("dflash-draft.dflash.target_layer_ids", T.UINT32, 3, "must be an array of integers; it is 3"),
        ("dflash-draft.dflash.target_layer_ids", T.STRING, "1,3,5", "must be an array of integers; it is '1,3,5'"),
        ("dflash-draft.dflash.block_size", T.UINT32, 0, "must be an integer >= 1; it is 0"),
        ("dflash-draft.dflash.mask_token_id", T.FLOAT32, 1.5, "must be an integer >= 0; it is 1.5"),
        ("dflash-draft.dflash.n_target_features", T.STRING, "x", "must be an integer >= 0; it is 'x'"),
    ])
    def test_refuses_a_key_of_the_wrong_type(self, tiny_models_built: TinyModels, fork_file: Path, tmp_path: Path,
                                             key: str, vtype: Any, value: Any, why: str):
        """A key a fork file needs, missing or of another type, is named with the file (it was
        int()-ed: a ValueError or TypeError traceback, or a float cut to an integer)."""
        odd = tmp_path / "odd.gguf"
        with gguf_tools.GgufFile(fork_file) as f:
            kvs = [(k, kv.raw()) for k, kv in f.kv.items() if k != key]
            if vtype is not None:
                kvs.append((key, gguf_tools.encode_value(vtype, value)))
            gguf_tools.write_gguf(odd, kvs, [(t.name, f, t) for t in f.tensors], f.alignment)
        out = tmp_path / "out.gguf"
        res = CliRunner().invoke(app, ["gguf", "migrate", str(odd), str(out), "--target",
                                       str(tiny_models_built.target_gguf)])
        text = " ".join(res.output.split())
        assert res.exit_code == Exit.USAGE, res.output
        assert f"{odd}: {key} {why}" in text and f"buun gguf inspect {odd}" in text
        assert not out.exists() and list(tmp_path.glob(".*partial")) == []

    def test_refuses_an_upstream_file(self, tiny_models_built: TinyModels, tmp_path: Path):
        with pytest.raises(UsageError, match="already in upstream's format"):
            gguf_tools.migrate(tiny_models_built.upstream_drafter_f16, tmp_path / "o.gguf")

    def test_refuses_a_target_of_another_size(self, fork_file: Path, tmp_path: Path):
        other = tmp_path / "other.gguf"
        w = gguf.GGUFWriter(other, "qwen35")
        w.add_uint32("qwen35.embedding_length", 128)
        w.add_uint32("qwen35.block_count", 8)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(UsageError, match="hidden sizes differ: drafter 256, target 128"):
            gguf_tools.migrate(fork_file, tmp_path / "o.gguf", other)

    def test_refuses_a_tensor_upstream_has_no_place_for(self, tiny_models_built: TinyModels, tmp_path: Path):
        fork = write_fork_drafter(tiny_models_built.drafter_dir, tmp_path / "fork.gguf",
                                  extra_tensor="dflash_tree_head.weight")
        with pytest.raises(UsageError, match="dflash_tree_head.weight has no counterpart"):
            gguf_tools.migrate(fork, tmp_path / "o.gguf", tiny_models_built.target_gguf)

    def test_cli(self, tiny_models_built: TinyModels, fork_file: Path, tmp_path: Path):
        out = tmp_path / "m.gguf"
        res = CliRunner().invoke(app, ["gguf", "migrate", str(fork_file), str(out), "--target",
                                       str(tiny_models_built.target_gguf), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["tensors"] == 25 and out.is_file()
        res = CliRunner().invoke(app, ["gguf", "migrate", str(out), str(tmp_path / "again.gguf")])
        assert res.exit_code == Exit.USAGE and "already in upstream's format" in " ".join(res.output.split())

    def test_cli_refuses_an_output_it_would_lose_or_misname(self, tiny_models_built: TinyModels, fork_file: Path,
                                                            tmp_path: Path):
        """OUT the --target file (a swapped argument replaced the target with the drafter), an existing
        file (replaced silently), a folder or one in a missing folder (named by the temporary file)."""
        target = tmp_path / "target.gguf"
        target.write_bytes(tiny_models_built.target_gguf.read_bytes())
        before = target.read_bytes()
        mine = tmp_path / "mine.gguf"
        mine.write_text("keep me")

        def migrate(out: Path, *more: str) -> tuple[int, str]:
            res = CliRunner().invoke(app, ["gguf", "migrate", str(fork_file), str(out), "--target", str(target),
                                           *more])
            return res.exit_code, " ".join(res.output.split())

        assert migrate(target) == (Exit.USAGE, f"error: the output {target} is the --target file "
                                               "hint: give the output another name")
        assert target.read_bytes() == before
        code, text = migrate(mine)
        assert code == Exit.USAGE and "exists" in text and "--force" in text and mine.read_text() == "keep me"
        code, text = migrate(tmp_path)
        assert code == Exit.USAGE and f"the output {tmp_path} is a folder" in text
        code, text = migrate(tmp_path / "none" / "o.gguf")
        assert code == Exit.USAGE and f"the output's folder {tmp_path / 'none'} does not exist" in text
        assert migrate(mine, "--force")[0] == 0 and mine.read_bytes()[:4] == b"GGUF"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fork.gguf", "mine.gguf", "target.gguf"]

    def test_cli_a_write_past_the_file_size_limit(self, tiny_models_built: TinyModels, fork_file: Path,
                                                  tmp_path: Path):
        """`ulimit -f` or FAT32's 4 GiB: exit 7 naming OUT and the limit, no traceback, nothing left."""
        import resource
        import subprocess
        import sys

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

        out = tmp_path / "out" / "m.gguf"
        out.parent.mkdir()
        res = subprocess.run([sys.executable, "-m", "buun_tool", "gguf", "migrate", str(fork_file), str(out),
                              "--target", str(tiny_models_built.target_gguf)],
                             preexec_fn=limit, capture_output=True, text=True, timeout=60)
        assert res.returncode == Exit.DISK and "Traceback" not in res.stderr, res.stderr
        assert f"could not write {out}: the file grew past" in " ".join(res.stderr.split())
        assert list(out.parent.iterdir()) == []

    @pytest.mark.slow
    def test_migrated_drafter_runs_in_llama_server(self, llama_bin: Path, tiny_models_built: TinyModels,
                                                   fork_file: Path, tmp_path: Path):
        out = tmp_path / "migrated.gguf"
        gguf_tools.migrate(fork_file, out, tiny_models_built.target_gguf)
        args = ["-m", str(tiny_models_built.target_gguf), "-md", str(out), "--spec-type", "draft-dflash",
                "-c", "512", "-t", "2", "--spec-draft-n-max", "7"]
        with llama_server(llama_bin, args, tmp_path / "server.log") as server:
            res: dict[str, Any] = server.complete("def fibonacci(n):", 24)
            assert len(res["tokens"]) == 24
            assert res["timings"]["draft_n"] > 0, server.log_tail()
        assert "block_size=16, mask_token_id=248070, n_extract=3" in (tmp_path / "server.log").read_text()
