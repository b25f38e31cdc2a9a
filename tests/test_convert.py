"""The drafter folder and the conversion, with the real vendored converter and the CPU build's
llama-quantize: pull (fake Hub) -> drafter folder -> BF16 GGUF -> Q4_K_M -> verify -> provenance,
byte-identical re-conversion, a failure that keeps the previous GGUF, and the pair answering in
the real llama-server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from buun_tool.base import paths
from buun_tool.base.errors import BuunError, CommandError, Exit, NotReadyError, UsageError
from buun_tool.cli.app import app
from buun_tool.formats import layout, recipes
from buun_tool.formats.gguf_tools import GgufFile
from buun_tool.pipeline import build, convert, drafter, pull, vendor
from tests.support.fake_hub import FakeHub
from tests.support.lock_holder import buun, env, finish, release, stderr_until
from tests.support.real_llama_server import llama_server
from tests.support.tiny_checkpoints import TinyModels, write_recipe


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _safetensors(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header


def _flat(text: str) -> str:
    return " ".join(text.split())


def read_only(folder: Path, *args: str) -> tuple[int, str]:
    """`python ARGS` (buun) with `folder` read-only, and its exit code and stderr: a read-only bind
    mount in a mount namespace of its own (unshare; as root too, which no mode bits stop), else,
    for a user other than root, the folder's write bits cleared while it runs."""
    cmd = [sys.executable, *args]
    if shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
        cmd = ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder), *cmd]
        proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stderr
    if os.geteuid() == 0:
        pytest.fail("a read-only folder needs `unshare -rm` (user namespaces) when the tests run as root")
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    try:
        proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(mode)
    return proc.returncode, proc.stderr


# --- the drafter folder (no converter needed) -----------------------------------------------

@pytest.fixture
def pulled(tiny_hub: FakeHub, tiny_recipe: recipes.Recipe) -> recipes.Recipe:
    pull.pull(tiny_recipe, paths.models_dir(), roles=("drafter", "tokenizer"))
    return tiny_recipe


class TestDrafterFolder:
    def test_copies_the_tokenizer_files_and_keeps_the_drafters_config(self, pulled: recipes.Recipe,
                                                                       tiny_models_built: TinyModels):
        lay = layout.for_recipe(pulled, paths.models_dir())
        own_config = _sha(lay.drafter_dir / "config.json")
        result = drafter.prepare(pulled, paths.models_dir())
        assert result.copied == list(pulled.tokenizer.files)
        for name in pulled.tokenizer.files:
            assert _sha(lay.drafter_dir / name) == _sha(lay.tokenizer_dir / name)
        assert _sha(lay.drafter_dir / "config.json") == own_config  # the drafter's own, untouched
        assert _sha(lay.tokenizer_dir / "config.json") == _sha(tiny_models_built.tokenizer_dir / "config.json")
        assert result.facts["target_layer_ids"] == [1, 3, 5] and result.facts["target_mrope"]
        assert result.facts["hidden_size"] == result.facts["target_hidden_size"] == 256

    def test_is_idempotent_and_repairs_a_changed_copy(self, pulled: recipes.Recipe):
        drafter.prepare(pulled, paths.models_dir())
        again = drafter.prepare(pulled, paths.models_dir())
        assert again.copied == [] and again.already_there == list(pulled.tokenizer.files)
        vocab = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "vocab.json"
        vocab.write_text("{}")
        assert drafter.prepare(pulled, paths.models_dir()).copied == ["vocab.json"]

    def test_a_full_disk_leaves_no_half_copy(self, pulled: recipes.Recipe):
        drafter.prepare(pulled, paths.models_dir())
        vocab = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "vocab.json"
        vocab.write_text("{}")  # to be copied again
        tmp = vocab.with_name(f".vocab.json.{os.getpid()}.tmp")
        tmp.symlink_to("/dev/full")  # the copy's first write answers ENOSPC, as on a full disk
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.DISK, res.output
        assert "the disk is full" in res.output
        assert not tmp.is_symlink() and not tmp.exists() and vocab.read_text() == "{}"

    def test_a_killed_copy_is_cleared_by_the_next_run(self, pulled: recipes.Recipe):
        """A `buun drafter` killed mid-copy (SIGKILL: no cleanup) left its half copy beside the real
        file for good, the size of the tokenizer each time; a running copy's is left alone."""
        import subprocess
        import sys
        drafter.prepare(pulled, paths.models_dir())
        folder = layout.for_recipe(pulled, paths.models_dir()).drafter_dir
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()  # a buun drafter that was killed
        half = folder / f".tokenizer.json.{dead}.tmp"
        half.write_bytes((folder / "tokenizer.json").read_bytes()[:100])
        running = folder / f".vocab.json.{os.getpid()}.tmp"
        running.write_text("{")
        again = drafter.prepare(pulled, paths.models_dir())
        assert again.copied == [] and not half.exists() and running.exists()
        running.unlink()

    def test_waits_for_the_models_folder(self, pulled: recipes.Recipe, holders):
        holder = holders(f"models:{paths.models_dir()}")  # a pull, say, that replaces the files it copies
        proc = buun("drafter", str(pulled.source))
        seen = stderr_until(proc, "...")
        assert f"(PID {holder.pid}) to finish with the models folder {paths.models_dir()}" in seen, seen
        release(holder)
        code, err = finish(proc, seen)
        assert code == 0 and "drafter folder ready" in err, err

    def test_refuses_to_overwrite_the_drafters_config(self, pulled: recipes.Recipe, tmp_path: Path):
        data = recipes.load_file(write_recipe(tmp_path / "bad.yaml", tokenizer={
            "repo": "Qwen/Qwen3.5-27B", "files": ["tokenizer.json", "config.json"]}))
        before = _sha(layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "config.json")
        with pytest.raises(UsageError) as info:
            drafter.prepare(data, paths.models_dir())
        assert "tokenizer.files lists config.json" in info.value.message and str(data.source) in info.value.message
        assert _sha(layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "config.json") == before

    @pytest.mark.parametrize(("change", "message"), [
        ({"hidden_size": 128}, "hidden sizes differ: drafter 128"),
        ({"dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 3, 8]}},
         "target_layer_ids [1, 3, 8] are not layers of the 8-layer target"),
        ({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash drafter"),
    ])
    def test_a_drafter_that_does_not_fit_the_target(self, pulled: recipes.Recipe, change: dict, message: str):
        cfg_path = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
        with pytest.raises(UsageError) as info:
            drafter.prepare(pulled, paths.models_dir())
        assert message in info.value.message

    @pytest.mark.parametrize(("role", "change", "message"), [
        ("drafter", {"dflash_config": [1, 3, 5]},
         "config.json: dflash_config must be an object, found a list ([1, 3, 5])"),
        ("drafter", {"dflash_config": "none"}, "config.json: dflash_config must be an object, found a string"),
        ("drafter", {"dflash_config": {"mask_token_id": 248070, "target_layer_ids": 5}},
         "dflash_config.target_layer_ids must be a list, found an integer (5)"),
        ("drafter", {"hidden_size": "256"}, "hidden_size must be a positive integer, found a string (\"256\")"),
        ("drafter", {"num_hidden_layers": None}, "num_hidden_layers is missing (a positive integer)"),
        ("drafter", {"num_attention_heads": 2.5, "head_dim": None},
         "num_attention_heads must be a positive integer, found a number (2.5)"),
        ("drafter", {"architectures": 7}, "architectures must be a list, found an integer (7)"),
        # bool is an int to Python: true was taken as token 1 and layer 1
        ("drafter", {"dflash_config": {"mask_token_id": True, "target_layer_ids": [1, 3, 5]}},
         "dflash_config.mask_token_id must be a non-negative integer, found a boolean (true)"),
        ("drafter", {"dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, True, 5]}},
         "dflash_config.target_layer_ids must be a list of non-negative integers, found a boolean (true)"),
        ("drafter", {"dflash_config": {"mask_token_id": 248070}, "target_layer_ids": [1, 3.0]},
         "config.json: target_layer_ids must be a list of non-negative integers, found a number (3.0)"),
        ("target", {"text_config": ["hidden_size", 256]}, "config.json: text_config must be an object, found a list"),
        ("target", {"text_config": "qwen3_5_text"}, "config.json: text_config must be an object, found a string"),
        ("target", {"text_config": {"hidden_size": 256, "num_hidden_layers": "8", "vocab_size": 248320}},
         "text_config.num_hidden_layers must be a positive integer, found a string (\"8\")"),
        ("target", {"text_config": {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": 248320,
                                    "rope_parameters": 7}}, "text_config.rope_parameters must be an object"),
        ("target", {"text_config": {"hidden_size": 256, "num_hidden_layers": 8}},
         "vocab_size is missing (a positive integer)"),
    ])
    def test_a_config_with_fields_of_the_wrong_type(self, pulled: recipes.Recipe, role: str, change: dict,
                                                    message: str):
        """A config.json is the repo author's: a section or a number of the wrong JSON type is named
        with its file and field (it was a TypeError or AttributeError traceback), in `buun drafter`
        and in the convert stage's pre-check, and nothing is copied over the drafter's own files."""
        lay = layout.for_recipe(pulled, paths.models_dir())
        cfg_path = (lay.drafter_dir if role == "drafter" else lay.tokenizer_dir) / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
        before = _sha(lay.drafter_dir / "config.json")
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.USAGE, res.output
        assert f"{cfg_path}: " in _flat(res.output) and message in _flat(res.output)
        assert "check their repos and revisions" in _flat(res.output)
        assert _sha(lay.drafter_dir / "config.json") == before
        assert convert.stage_status(pulled, paths.models_dir()).detail.startswith("a config.json has fields")

    @pytest.mark.parametrize(("role", "name", "damage", "message"), [
        ("drafter", "model.safetensors", lambda b: b[:100], "header claims"),
        ("drafter", "model.safetensors", lambda b: b[:6], "is 6 bytes: too short for a safetensors header"),
        ("drafter", "model.safetensors", lambda b: b[:8] + b"[" * (len(b) - 8), "its header is not valid JSON"),
        ("drafter", "model.safetensors", lambda b: b[:len(b) // 2], "outside the file's"),
        ("tokenizer", "tokenizer_config.json", lambda b: b"<html>rate limited</html>", "is not valid JSON"),
        ("tokenizer", "tokenizer.json", lambda b: b"\xff\xfe" + b, "is not valid JSON: not UTF-8 text"),
        # json reads an integer of at most 4300 digits; a longer one was a ValueError traceback
        ("tokenizer", "tokenizer.json", lambda b: b'{"n": ' + b"9" * 5000 + b"}",
         "is not valid JSON: an integer of 5000 digits"),
        ("drafter", "model.safetensors", lambda b: _safetensors(b'{"w": {"data_offsets": [0, 1' + b"0" * 5000 + b"]}}"),
         "its header is not valid JSON: an integer of 5001 digits"),
    ])
    def test_a_file_the_converter_cannot_read_is_named(self, pulled: recipes.Recipe, role: str, name: str,
                                                       damage: Callable[[bytes], bytes], message: str,
                                                       monkeypatch: pytest.MonkeyPatch):
        """A truncated safetensors header or a tokenizer file that is not JSON is named, with what to
        do, by `buun drafter` and before a conversion makes its environment: it passed, and only
        the converter, after installing its environment, met the file."""
        lay = layout.for_recipe(pulled, paths.models_dir())
        path = lay.role_dir(role) / name
        path.write_bytes(damage(path.read_bytes()))
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.USAGE, res.output
        bad = lay.drafter_dir / name
        assert "files the converter cannot read" in _flat(res.output) and f"{bad}" in _flat(res.output)
        assert message in _flat(res.output) and f"buun pull --verify {pulled.ref}" in _flat(res.output)
        monkeypatch.setattr(convert, "converter_python", lambda *a: pytest.fail("the converter was set up"))
        with pytest.raises(UsageError, match="files the converter cannot read"):
            convert.convert(pulled, paths.models_dir())

    def test_a_file_changed_since_its_check_is_checked_again(self, pulled: recipes.Recipe):
        """Each JSON content is parsed once (`buun setup` checks the folder in the drafter stage and
        again before converting): the same file damaged since, to its old size and mtime, is not
        taken for the one that parsed."""
        drafter.prepare(pulled, paths.models_dir())
        path = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "tokenizer.json"
        before = path.stat()
        path.write_bytes(b"[" + path.read_bytes()[1:])  # an object's '{' made a list's '['
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        with pytest.raises(UsageError, match=f"{re.escape(str(path))} is not valid JSON"):
            drafter.check_readable(pulled, paths.models_dir())

    def test_a_safetensors_header_larger_than_the_format_allows_is_not_read(self, pulled: recipes.Recipe):
        """The header's length is the file's to say: a drafter of 16 GB that says 15 GB had them read
        into memory and parsed as JSON. The format caps it at 100 MB (safetensors refuses more)."""
        path = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "model.safetensors"
        with open(path, "wb") as f:  # sparse: the claimed header costs no disk
            f.write((drafter.SAFETENSORS_MAX_HEADER + 1).to_bytes(8, "little"))
            f.truncate(8 + drafter.SAFETENSORS_MAX_HEADER + 1)
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.USAGE, res.output
        assert (f"{path}: its header claims 100000001 bytes, more than the 100000000 a safetensors file may have"
                in _flat(res.output))

    def test_a_config_with_a_number_too_long_to_read_is_named(self, pulled: recipes.Recipe):
        cfg = layout.for_recipe(pulled, paths.models_dir()).tokenizer_dir / "config.json"
        cfg.write_text('{"vocab_size": ' + "1" * 5000 + "}")
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.FAILED, res.output
        assert f"the target config {cfg} is not valid JSON: an integer of 5000 digits" in _flat(res.output)

    def test_a_config_that_is_not_text_is_named(self, pulled: recipes.Recipe):
        cfg = layout.for_recipe(pulled, paths.models_dir()).drafter_dir / "config.json"
        cfg.write_bytes(b"\x89PNG\r\n\x1a\n")
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.FAILED, res.output
        assert f"the drafter config {cfg} is not valid JSON: not UTF-8 text (byte 0)" in _flat(res.output)

    def test_the_recipe_expectations_are_checked(self, tiny_hub: FakeHub, tmp_path: Path):
        r = recipes.load_file(write_recipe(tmp_path / "r.yaml", expect={"block_size": 8}))
        pull.pull(r, paths.models_dir(), roles=("drafter", "tokenizer"))
        with pytest.raises(UsageError, match=r"expect.block_size is 8 but the drafter has 16"):
            drafter.prepare(r, paths.models_dir())

    def test_needs_a_pull_first(self, tiny_recipe: recipes.Recipe):
        with pytest.raises(NotReadyError) as info:
            drafter.prepare(tiny_recipe, paths.models_dir())
        assert "is not downloaded" in info.value.message
        assert f"run `buun pull {tiny_recipe.source}`" in (info.value.hint or "")  # a file: named by its path

    def test_files_the_recipe_does_not_name_are_refused_by_name(self, pulled: recipes.Recipe,
                                                                monkeypatch: pytest.MonkeyPatch):
        """The converter reads what a folder holds: a model.safetensors.index.json makes it read the
        shards it names instead of model.safetensors, and a chat template in the tokenizer folder
        goes into the GGUF; the record named only the recipe's files. Such files are refused, each
        named, by `buun drafter` and before a conversion, until they are moved out."""
        drafter.prepare(pulled, paths.models_dir())
        lay = layout.for_recipe(pulled, paths.models_dir())
        weights = (lay.drafter_dir / "model.safetensors").read_bytes()
        stray = [lay.drafter_dir / "model.safetensors.index.json", lay.drafter_dir / "model-00001-of-00001.safetensors",
                 lay.tokenizer_dir / "chat_template.jinja"]
        stray[0].write_text(json.dumps({"weight_map": {"fc.weight": stray[1].name}}))
        stray[1].write_bytes(weights)
        stray[2].write_text("{{ messages }}")
        res = CliRunner().invoke(app, ["drafter", str(pulled.source)])
        assert res.exit_code == Exit.USAGE, res.output
        out = "".join(res.output.split())  # rich wraps long paths anywhere
        assert "themodelfoldersholdfilestherecipedoesnotname" in out
        assert all(str(p) in out for p in stray), res.output
        assert "movethemoutofthesefolders" in out and "drafter.filesortokenizer.files" in out
        monkeypatch.setattr(convert, "converter_python", lambda *a: pytest.fail("the converter was set up"))
        with pytest.raises(UsageError, match="files the recipe does not name"):
            convert.convert(pulled, paths.models_dir())
        assert "files the recipe does not name" in convert.stage_status(pulled, paths.models_dir()).detail
        for p in stray:
            p.unlink()
        assert drafter.prepare(pulled, paths.models_dir()).copied == []

    def test_convert_needs_the_drafter_folder(self, pulled: recipes.Recipe):
        with pytest.raises(NotReadyError) as info:
            convert.convert(pulled, paths.models_dir())
        assert "drafter folder is incomplete" in info.value.message and "tokenizer.json" in info.value.message


# --- the conversion -------------------------------------------------------------------------

@dataclass(frozen=True)
class Converted:
    models: Path
    recipe: recipes.Recipe
    commits: dict[str, str]
    cli_json: dict


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tiny_models_built: TinyModels,
              converter_python: Path, llama_bin: Path) -> Iterator[Converted]:
    """pull -> drafter -> convert once through the CLI, into a folder tests copy from."""
    root = tmp_path_factory.mktemp("converted")
    hub = FakeHub().start()
    for repo, files in tiny_models_built.hub_repos().items():
        hub.add_repo(repo, files)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hub.url)
        mp.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
        mp.delenv("HF_TOKEN", raising=False)
        mp.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(root / "no-hf-token"))
        mp.setenv("BUUN_CACHE_DIR", str(converter_python.parent.parent.parent))
        for var in ("BUUN_STATE_DIR", "BUUN_DATA_DIR", "BUUN_CONFIG_DIR"):  # no user folder is touched
            mp.setenv(var, str(root / var.lower()))
        recipe_file = write_recipe(root / "tiny-dflash.yaml")
        models = root / "models"
        runner = CliRunner()
        for cmd in (["pull"], ["drafter"], ["convert", "--json"]):
            res = runner.invoke(app, [*cmd, str(recipe_file), "--models-dir", str(models)])
            assert res.exit_code == 0, res.output
        cli_json = json.loads(res.stdout)
    hub.stop()
    commits = {repo: r.commit for repo, r in hub.repos.items()}
    yield Converted(models, recipes.load_file(recipe_file), commits, cli_json)


@pytest.fixture
def models(converted: Converted, tmp_path: Path) -> Path:
    """A private copy of the converted models folder."""
    dest = tmp_path / "models"
    shutil.copytree(converted.models, dest)
    return dest


@pytest.mark.slow
class TestConvert:
    def test_output_is_verified_and_described(self, converted: Converted):
        lay = layout.for_recipe(converted.recipe, converted.models)
        final = lay.drafter_gguf()
        assert converted.cli_json["gguf"] == str(final) and converted.cli_json["rebuilt"]
        assert converted.cli_json["intermediate"] == str(lay.drafter_gguf("BF16"))  # the drafter is BF16
        v = converted.cli_json["verified"]
        assert v["architecture"] == "dflash" and v["block_size"] == 16 and v["mask_token_id"] == 248070
        assert v["target_layers"] == [2, 4, 6] and v["hidden_size"] == 256 and v["block_count"] == 2
        assert v["rope_sections"] == [64, 0, 0, 0] and v["vocab_tokens"] == 248320
        assert v["file_type"] == 15 and v["tensor_count"] == 3 + 11 * 2  # MOSTLY_Q4_K_M
        assert set(v["tensor_types"]) <= {"F32", "Q4_K", "Q5_K", "Q6_K", "Q8_0"}
        assert [p.name for p in lay.gguf_dir.iterdir() if p.name.startswith(".")] == []

    def test_provenance_record(self, converted: Converted):
        lay = layout.for_recipe(converted.recipe, converted.models)
        final, intermediate = lay.drafter_gguf(), lay.drafter_gguf("BF16")
        record = json.loads(convert.provenance_path(final).read_text())
        assert record["output"] == {"file": final.name, "size": final.stat().st_size, "sha256": _sha(final),
                                    "type": "Q4_K_M"}
        assert record["intermediate"] == intermediate.name
        assert record["recipe"] == {"name": "tiny-dflash", "file": "tiny-dflash.yaml"}
        inputs = record["inputs"]
        assert inputs["sources"]["drafter"]["commit"] == converted.commits["z-lab/Qwen3.5-27B-DFlash"]
        assert inputs["sources"]["tokenizer"]["commit"] == converted.commits["Qwen/Qwen3.5-27B"]
        assert inputs["sources"]["drafter"]["files"]["model.safetensors"] == _sha(lay.drafter_dir / "model.safetensors")
        assert inputs["sources"]["tokenizer"]["files"]["config.json"] == _sha(lay.tokenizer_dir / "config.json")
        assert inputs["llama_cpp"]["pin"] == vendor.load_pin().commit
        assert inputs["llama_cpp"]["source"]["commits"] == build.source_state(paths.llama_dir())["commits"]
        assert inputs["llama_cpp"]["gguf_py"]
        assert inputs["quantize"]["variant"] == "cpu" and inputs["quant"] == "Q4_K_M"
        assert inputs["converter_env"]["requirements"] == list(convert.CONVERTER_REQUIREMENTS)
        assert inputs["converter_env"]["installed"]["torch"].startswith("2.13.0")
        own = json.loads(convert.provenance_path(intermediate).read_text())  # the BF16 file has its own
        assert own["output"] == {"file": intermediate.name, "size": intermediate.stat().st_size,
                                 "sha256": _sha(intermediate), "type": "BF16"}
        assert own["inputs"] == {k: inputs[k] for k in ("sources", "llama_cpp", "converter_env", "outtype")}

    def test_refuses_to_start_without_the_disk_space(self, converted: Converted, models: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
        lay = layout.for_recipe(converted.recipe, models)
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        monkeypatch.setattr(convert.shutil, "disk_usage", lambda _: SimpleNamespace(free=10**6))
        with pytest.raises(BuunError) as info:
            convert.convert(converted.recipe, models, force=True)
        assert info.value.exit_code == Exit.DISK and "not enough disk space" in info.value.message
        assert {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before

    def test_another_quant_only_requantizes(self, converted: Converted, models: Path, tmp_path: Path):
        r = recipes.load_file(write_recipe(tmp_path / "tiny-dflash.yaml", quantize="Q8_0"))
        result = convert.convert(r, models)
        assert Path(result.gguf).name == "Qwen3.5-27B-DFlash-Q8_0.gguf" and result.verified["file_type"] == 7
        log = (paths.state_dir() / "logs" / "convert-tiny-dflash.log").read_text()
        assert "convert_hf_to_gguf.py" not in log and "llama-quantize" in log

    def test_unchanged_inputs_are_a_no_op(self, converted: Converted, models: Path):
        final = layout.for_recipe(converted.recipe, models).drafter_gguf()
        mtime = final.stat().st_mtime_ns
        result = convert.convert(converted.recipe, models)
        assert not result.rebuilt and final.stat().st_mtime_ns == mtime

    def test_converting_again_gives_the_same_bytes(self, converted: Converted, models: Path):
        lay = layout.for_recipe(converted.recipe, models)
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        (lay.drafter_gguf()).unlink()
        (lay.drafter_gguf("BF16")).unlink()
        result = convert.convert(converted.recipe, models, force=True)
        assert result.rebuilt
        assert {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before  # GGUFs and provenance alike

    def test_a_failed_quantization_keeps_the_previous_gguf(self, converted: Converted, models: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        fake_bin = tmp_path / "bin"
        fake_bin.mkdir()
        quantize = fake_bin / "llama-quantize"
        # writes half of a file under the output name it was given, then fails
        quantize.write_text('#!/bin/sh\nhead -c 1000 "$1" > "$2"\necho "ggml_abort: out of memory" >&2\nexit 3\n')
        quantize.chmod(0o755)
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_bin))
        lay = layout.for_recipe(converted.recipe, models)
        good = _sha(lay.drafter_gguf())
        record = convert.provenance_path(lay.drafter_gguf()).read_text()
        with pytest.raises(CommandError) as info:
            convert.convert(converted.recipe, models)
        assert "llama-quantize failed (exit 3)" in info.value.message and "out of memory" in info.value.message
        assert _sha(lay.drafter_gguf()) == good
        assert convert.provenance_path(lay.drafter_gguf()).read_text() == record
        assert [p.name for p in lay.gguf_dir.iterdir() if "partial" in p.name] == []

    def test_a_gguf_that_fails_verification_never_lands(self, converted: Converted, models: Path,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        fake_bin = tmp_path / "bin"
        fake_bin.mkdir()
        quantize = fake_bin / "llama-quantize"
        quantize.write_text('#!/bin/sh\ncp "$1" "$2"\n')  # "succeeds" without quantizing
        quantize.chmod(0o755)
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_bin))
        lay = layout.for_recipe(converted.recipe, models)
        good = _sha(lay.drafter_gguf())
        with pytest.raises(BuunError) as info:
            convert.convert(converted.recipe, models)
        assert "failed verification" in info.value.message
        assert "file_type: expected 15, found 32" in info.value.message  # BF16 left as it was
        assert "not quantized to Q4_K_M" in info.value.message
        assert _sha(lay.drafter_gguf()) == good
        assert [p.name for p in lay.gguf_dir.iterdir() if "partial" in p.name] == []

    def test_a_failed_conversion_keeps_the_previous_ggufs(self, converted: Converted, models: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        lay = layout.for_recipe(converted.recipe, models)
        # a converter that writes half a file under the name it was given, then dies (a truncated
        # source is refused before the converter runs: test_a_changed_source_is_refused_...)
        python = tmp_path / "python"
        python.write_text('#!/bin/sh\nwhile [ "$1" != --outfile ]; do shift; done\nhead -c 1000 /dev/zero > "$2"\n'
                          'echo "RuntimeError: out of memory" >&2\nexit 1\n')
        python.chmod(0o755)
        monkeypatch.setenv("BUUN_CONVERTER_PYTHON", str(python))
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        with pytest.raises(CommandError) as info:
            convert.convert(converted.recipe, models, force=True)
        assert "the GGUF converter failed" in info.value.message
        assert info.value.log_path and Path(info.value.log_path).is_file()
        assert {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before

    def test_a_changed_source_is_refused_until_pull_verify_repairs_it(self, converted: Converted, models: Path,
                                                                      tiny_hub: FakeHub):
        lay = layout.for_recipe(converted.recipe, models)
        weights = lay.drafter_dir / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-100] ^= 0xFF  # a byte flipped on disk after the pull
        weights.write_bytes(bytes(data))
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        args = [str(converted.recipe.source), "--models-dir", str(models)]
        res = CliRunner().invoke(app, ["convert", *args])
        assert res.exit_code == Exit.NOT_READY, res.output
        out = "".join(res.output.split())  # rich wraps long paths anywhere
        assert "sourcefileschangedondisksince`buunpull`verifiedthem" in out and str(weights) in out
        assert f"run`buunpull--verify{converted.recipe.ref}`" in out  # named as the user gave it
        assert {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before
        res = CliRunner().invoke(app, ["pull", *args, "--only", "drafter,tokenizer", "--verify"])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(app, ["convert", *args, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["rebuilt"] is False  # the GGUF was made from the good bytes

    def test_a_changed_source_is_refused_even_with_its_old_mtime(self, converted: Converted, models: Path):
        weights = layout.for_recipe(converted.recipe, models).drafter_dir / "model.safetensors"
        st = weights.stat()
        data = bytearray(weights.read_bytes())
        data[-100] ^= 0xFF
        weights.write_bytes(bytes(data))
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as the manifest says
        with pytest.raises(NotReadyError) as info:
            convert.convert(converted.recipe, models, force=True)  # a conversion hashes what it reads
        assert str(weights) in info.value.message and "buun pull --verify" in (info.value.hint or "")

    @pytest.mark.parametrize("keep_mtime", [False, True])
    def test_a_source_changed_while_the_converter_reads_it_is_refused(
            self, converted: Converted, models: Path, converter_python: Path, tiny_hub: FakeHub, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch, keep_mtime: bool):
        """The sources were hashed, then read again by the converter: a byte flipped in between gave a
        GGUF of the flipped bytes, exit 0, and a record naming the good hash, so after `buun pull
        --verify` it was "up to date". The converter's interpreter here flips a byte of the weights
        (its mtime put back or not) after buun hashed them, then converts."""
        lay = layout.for_recipe(converted.recipe, models)
        weights = lay.drafter_dir / "model.safetensors"
        flip = tmp_path / "flip.py"
        flip.write_text(f"import os\np = {str(weights)!r}\nst = os.stat(p)\ndata = bytearray(open(p, 'rb').read())\n"
                        "data[-100] ^= 0xFF\nopen(p, 'r+b').write(data)\n"
                        + ("os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n" if keep_mtime else ""))
        python = tmp_path / "bin" / "python"
        python.parent.mkdir()
        python.write_text(f'#!/bin/sh\n"{converter_python}" "{flip}" || exit 9\nexec "{converter_python}" "$@"\n')
        python.chmod(0o755)
        monkeypatch.setenv("BUUN_CONVERTER_PYTHON", str(python))
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        args = [str(converted.recipe.source), "--models-dir", str(models)]
        res = CliRunner().invoke(app, ["convert", *args, "--force"])
        assert res.exit_code == Exit.NOT_READY, res.output
        out = "".join(res.output.split())  # rich wraps long paths anywhere
        assert "theconverter'ssourceschangedwhileitreadthem" in out and f"{weights}(changed)" in out, res.output
        assert f"run`buunpull--verify{converted.recipe.ref}`" in out
        assert {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before  # no GGUF or record of those bytes
        monkeypatch.delenv("BUUN_CONVERTER_PYTHON")
        res = CliRunner().invoke(app, ["pull", *args, "--only", "drafter,tokenizer", "--verify"])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(app, ["convert", *args, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["rebuilt"] is False  # the GGUF kept is of the good bytes

    @pytest.mark.parametrize("writer", ["the GGUF converter", "llama-quantize"])
    def test_a_full_disk_under_the_converter_or_llama_quantize_is_exit_7(self, converted: Converted, models: Path,
                                                                          tmp_path: Path, writer: str):
        """The converter ran out of room with a Python traceback (exit 1), llama-quantize with
        `iostream error`: both came out as a failed step with a generic hint. Here every write of
        the child's output answers ENOSPC, as on a full disk (its temporary name leads to /dev/full)."""
        recipe = converted.recipe
        if writer == "llama-quantize":  # another quant: the intermediate is current, only llama-quantize writes
            recipe = recipes.load_file(write_recipe(tmp_path / "tiny-dflash.yaml", quantize="Q8_0"))
        lay = layout.for_recipe(recipe, models)
        out = lay.drafter_gguf("BF16") if writer == "the GGUF converter" else lay.drafter_gguf()
        before = {p.name: _sha(p) for p in lay.gguf_dir.iterdir()}
        tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
        tmp.symlink_to("/dev/full")
        res = CliRunner().invoke(app, ["convert", str(recipe.source), "--models-dir", str(models), "--force"])
        assert res.exit_code == Exit.DISK, res.output
        flat = "".join(res.output.split())  # rich wraps long paths anywhere
        assert f"thediskisfull:{''.join(writer.split())}couldnotwrite{out}(Nospaceleftondevice)" in flat, res.output
        assert "convertingneedsabout" in flat and f"freein{lay.gguf_dir}," in flat and "isfree" in flat
        assert "freesomespace" in flat and "thepreviousGGUFiskept" in flat
        assert "Traceback" not in res.output and "iostream" not in res.output
        assert not tmp.is_symlink() and {p.name: _sha(p) for p in lay.gguf_dir.iterdir()} == before

    def test_the_convert_log_is_the_owners_only(self, converted: Converted, models: Path, tmp_path: Path):
        """The log names the models, the folders and the converter's environment: 0600 as the
        server's state files, also when an older buun left it 0644."""
        log = paths.state_dir() / "logs" / "convert-tiny-dflash.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("an older run's\n")
        log.chmod(0o644)
        r = recipes.load_file(write_recipe(tmp_path / "tiny-dflash.yaml", quantize="Q8_0"))
        assert convert.convert(r, models).rebuilt
        assert log.stat().st_mode & 0o777 == 0o600 and "an older run's" not in log.read_text()
        assert log.parent.stat().st_mode & 0o777 == 0o700

    def test_a_convert_waits_for_a_patch_of_the_vendored_tree(self, converted: Converted, models: Path, holders,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """A convert runs the tree's converter script and gguf-py and records the tree: a `buun patch`
        (or vendor) changing it meanwhile made a GGUF of neither. It holds the tree shared, as a build."""
        tree = tmp_path / "vendor" / "llama.cpp"  # the lock file lies beside it: this test's own
        tree.parent.mkdir()
        tree.symlink_to(paths.llama_dir())
        monkeypatch.setenv("BUUN_LLAMA_DIR", str(tree))
        holder = holders("vendor")  # a patch applying the series
        proc = buun("convert", str(converted.recipe.source), "--models-dir", str(models))
        seen = stderr_until(proc, "...")
        assert f"(PID {holder.pid}) to finish with the vendored tree {tree}" in seen, seen
        release(holder)
        code, err = finish(proc, seen)
        assert code == 0 and "is up to date" in _flat(err), err
        holder = holders("vendor-shared")  # a build reading the tree: no wait
        code, err = finish(buun("convert", str(converted.recipe.source), "--models-dir", str(models)))
        assert code == 0 and "waiting" not in err and "is up to date" in _flat(err), err

    def test_a_read_only_models_folder_still_answers_up_to_date(self, converted: Converted, models: Path):
        """`buun drafter` and `buun convert` take the models folder's lock, a file they make in it: in a
        folder they cannot write (a read-only mount, another user's) they failed with exit 2 where
        the work was done. Done, they say so; with work to do, they say why nothing is done."""
        (models / ".buun.lock").unlink(missing_ok=True)
        recipe = str(converted.recipe.source)
        for cmd, done in (("drafter", "tokenizer files already there"), ("convert", "is up to date")):
            code, err = read_only(models, "-m", "buun_tool", cmd, recipe, "--models-dir", str(models))
            assert code == 0 and done in _flat(err), err
            assert "Read-only" not in err and "Permission denied" not in err
        final = layout.for_recipe(converted.recipe, models).drafter_gguf()
        convert.provenance_path(final).unlink()  # to be made again
        code, err = read_only(models, "-m", "buun_tool", "convert", recipe, "--models-dir", str(models))
        assert code == Exit.USAGE, err
        assert f"{final.name} is to be made ({final.name} is not made yet" in _flat(err)
        assert "cannot be written" in _flat(err) and "make the models folder writable" in _flat(err)
        assert not (models / ".buun.lock").exists()

    def test_a_gguf_whose_record_does_not_vouch_for_its_sources_is_made_again(self, converted: Converted,
                                                                           models: Path):
        final = layout.for_recipe(converted.recipe, models).drafter_gguf()
        record_path = convert.provenance_path(final)
        record = json.loads(record_path.read_text())
        assert record["buun_provenance"] == convert.PROVENANCE
        record["buun_provenance"] = 1  # older buun: source hashes copied from the manifest, not read
        record_path.write_text(json.dumps(record))
        result = convert.convert(converted.recipe, models)
        assert result.rebuilt and json.loads(record_path.read_text())["buun_provenance"] == convert.PROVENANCE

    @pytest.mark.parametrize("damage", ["list", "number", "output", "inputs"])
    def test_a_record_of_another_json_shape_is_made_again(self, converted: Converted, models: Path, damage: str):
        final = layout.for_recipe(converted.recipe, models).drafter_gguf()
        record_path = convert.provenance_path(final)
        record = json.loads(record_path.read_text())
        if damage in ("output", "inputs"):  # the rest of the record is right: only this field is read wrong
            record[damage] = [record[damage]]
        record_path.write_text(json.dumps({"list": [record], "number": 7}.get(damage, record)))
        status = convert.stage_status(converted.recipe, models)  # an AttributeError traceback before
        assert not status.current and "provenance record buun cannot read" in status.detail
        if damage == "list":  # one conversion is enough to show it is redone, not refused
            assert convert.convert(converted.recipe, models).rebuilt
            assert json.loads(record_path.read_text())["buun_provenance"] == convert.PROVENANCE

    def test_the_pair_answers_in_llama_server(self, converted: Converted, llama_bin: Path, tmp_path: Path):
        lay = layout.for_recipe(converted.recipe, converted.models)
        args = ["-m", str(lay.target_gguf), "-md", str(lay.drafter_gguf()), "--spec-type", "draft-dflash",
                "-c", "512", "-t", "2", "--spec-draft-n-max", "7"]
        with llama_server(llama_bin, args, tmp_path / "server.log") as server:
            res = server.complete("The capital of France is", 24)
            assert len(res["tokens"]) == 24 and isinstance(res["content"], str)
            assert res["timings"]["draft_n"] > 0, server.log_tail()
        log = (tmp_path / "server.log").read_text()
        assert "block_size=16, mask_token_id=248070, n_extract=3" in log

    def test_a_tree_sweep_of_the_recipes_models_runs_on_their_own_acceptance(
            self, converted: Converted, llama_bin: Path, tmp_path: Path) -> None:
        """`buun bench --recipe-models --tree-budget`: the pair the pipeline made, not buun synth's, so
        every budget runs on the drafter's real acceptance (no synthetic profile), and the fastest is named."""
        recipe = str(converted.recipe.source)
        res = CliRunner().invoke(app, [
            "bench", recipe, "--recipe-models", "--models-dir", str(converted.models), "--tree-budget", "4",
            "--no-ar", "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "32", "--ctx", "1024",
            "--server-args=-nr", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / "bench.json").read_text())
        lay = layout.for_recipe(converted.recipe, converted.models)
        assert data["options"]["models_note"] == f"models: {lay.target_gguf.name} + {lay.drafter_gguf().name}"
        configs = {c["name"]: c for c in data["configs"]}
        assert [(c["label"], c["tree_budget"], c["expected_al"]) for c in configs.values()] == [
            ("DFlash chain", 0, None), ("DFlash tree 4", 4, None)]
        for cfg in configs.values():
            assert cfg["argv"][cfg["argv"].index("-m") + 1] == str(lay.target_gguf)
            assert "--spec-synth-tree" not in cfg["argv"] and "--spec-synth-len" not in cfg["argv"]
        assert all(r["steps"] > 0 for r in data["summary"])
        assert re.search(r"tree sweep: (the chain is|budget 4 is) the fastest on these models", _flat(res.output))
        for given in (["--target", str(lay.target_gguf)], ["--url", "http://127.0.0.1:9"], ["--scale", "full"]):
            res = CliRunner().invoke(app, ["bench", recipe, "--recipe-models", *given])
            assert res.exit_code == 2 and "--recipe-models benches the recipe's pair" in _flat(res.output)

    def test_recipe_models_not_pulled_say_what_to_run(self, converted: Converted, tmp_path: Path) -> None:
        res = CliRunner().invoke(app, ["bench", str(converted.recipe.source), "--recipe-models", "--models-dir",
                                       str(tmp_path / "empty")])
        assert res.exit_code != 0 and "the target model of tiny-dflash is not downloaded" in _flat(res.output)
        assert "run `buun pull" in _flat(res.output)

    def test_after_llama_quantize_is_rebuilt_setup_and_convert_agree(
            self, converted: Converted, models: Path, llama_bin: Path, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch):
        """llama-quantize rebuilt, simulated by what the records compare and without touching the
        shared build: BUUN_BUILD_DIR points at a folder under tmp_path with a copy of the CPU
        build's binaries and its stamp (so the build stage of a CPU setup is current), and beside it
        the same binaries under a CUDA build's stamp, as after a `buun build` on a GPU machine:
        buun's llama-quantize is now that build's, while the GGUF's provenance names the CPU one.
        The setup plan and `buun convert` both say the conversion is stale, for the same reason;
        once `buun convert` has re-quantized, both say it is current."""
        from buun_tool.app import setup

        stamp = build.read_stamp("cpu")
        assert stamp is not None
        builds = tmp_path / "build"
        shutil.copytree(llama_bin, builds / "cpu" / "bin", symlinks=True)
        (builds / "cpu" / build.STAMP).write_text(json.dumps(stamp))
        (builds / "cuda").mkdir()
        (builds / "cuda" / "bin").symlink_to(builds / "cpu" / "bin")
        (builds / "cuda" / build.STAMP).write_text(json.dumps({**stamp, "variant": "cuda", "arch": "90"}))
        monkeypatch.setenv("BUUN_BUILD_DIR", str(builds))
        monkeypatch.delenv("BUUN_LLAMA_BIN_DIR", raising=False)
        recipe = converted.recipe
        ctx = setup.Context(recipe, models, cpu=True)

        def plan() -> dict[str, setup.PlanRow]:
            return {row.stage: row for row in setup.plan(ctx)}

        assert build.find_binary("llama-quantize").parent == builds / "cuda" / "bin"
        status = convert.stage_status(recipe, models)
        assert not status.current and status.detail == "llama-quantize was rebuilt since (its build stamp changed)"
        before = plan()
        assert before["build"].action == "skip" and before["convert"].action == "run"
        assert before["convert"].detail == status.detail
        res = CliRunner().invoke(app, ["convert", str(recipe.source), "--models-dir", str(models), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["rebuilt"] and "llama-quantize was rebuilt" in _flat(res.stderr)
        assert convert.stage_status(recipe, models).current and plan()["convert"].action == "skip"

    def test_a_second_convert_waits_and_finds_it_made(self, converted: Converted, models: Path, holders):
        # it cleared the first one's half-written GGUF as a killed run's: "the converter wrote no ..."
        holder = holders(f"models:{models}")
        proc = buun("convert", str(converted.recipe.source), "--models-dir", str(models))
        seen = stderr_until(proc, "...")
        assert f"(PID {holder.pid}) to finish with the models folder {models}" in seen, seen
        release(holder)
        code, err = finish(proc, seen)
        assert code == 0 and "is up to date" in _flat(err), err

    def test_convert_cli_reports_up_to_date(self, converted: Converted, models: Path):
        res = CliRunner().invoke(app, ["convert", str(converted.recipe.source), "--models-dir", str(models),
                                       "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["rebuilt"] is False
        assert "is up to date" in _flat(res.stderr)


@pytest.mark.slow
def test_a_float_recipe_needs_no_quantize(tiny_hub: FakeHub, tiny_models_built: TinyModels, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(tmp_path / "no-build"))  # no llama-quantize anywhere
    r = recipes.load_file(write_recipe(tmp_path / "f16.yaml", quantize="F16"))
    pull.pull(r, paths.models_dir(), roles=("drafter", "tokenizer"))
    drafter.prepare(r, paths.models_dir())
    result = convert.convert(r, paths.models_dir())
    f16 = layout.for_recipe(r, paths.models_dir()).drafter_gguf("F16")
    assert result.intermediate is None and Path(result.gguf) == f16
    assert result.verified["file_type"] == 1 and set(result.verified["tensor_types"]) == {"F16", "F32"}
    # the same converter on the same checkpoint: the same tensors as the fixture's own conversion
    with GgufFile(Path(result.gguf)) as got, GgufFile(tiny_models_built.upstream_drafter_f16) as ref:
        assert [(t.name, b"".join(got.tensor_bytes(t))) for t in got.tensors] == \
               [(t.name, b"".join(ref.tensor_bytes(t))) for t in ref.tensors]


# --- patch 0009: the fork's workflow, a self-contained drafter folder --------------------------

@pytest.mark.slow
class TestSelfContainedDrafter:
    """The vendored converter on the drafter folder alone (the target's tokenizer copied in, no
    --target-model-dir), as the buun fork documents; and the error for a folder with no tokenizer."""

    def test_converts_without_target_model_dir(self, converted: Converted, models: Path, converter_python: Path,
                                               tmp_path: Path):
        lay = layout.for_recipe(converted.recipe, models)
        out = tmp_path / "self-contained.gguf"
        convert.run_converter(converter_python, lay.drafter_dir, None, out, "bf16", tmp_path / "convert.log")
        with GgufFile(out) as f, GgufFile(lay.drafter_gguf()) as ref:
            assert f.architecture == "dflash"
            assert f.get("tokenizer.ggml.mask_token_id") == converted.recipe.expect["mask_token_id"]
            assert list(f.get("dflash.target_layers")) == [i + 1 for i in converted.recipe.expect["target_layer_ids"]]
            # the same vocabulary as the conversion that was given the target's folder
            assert f.get("tokenizer.ggml.pre") == ref.get("tokenizer.ggml.pre") == "qwen35"
            assert list(f.get("tokenizer.ggml.tokens")) == list(ref.get("tokenizer.ggml.tokens"))

    def test_a_folder_without_tokenizer_says_what_to_copy(self, converted: Converted, models: Path,
                                                          converter_python: Path, tmp_path: Path):
        lay = layout.for_recipe(converted.recipe, models)
        bare = tmp_path / "bare-drafter"
        bare.mkdir()
        for name in converted.recipe.drafter.files:
            shutil.copy(lay.drafter_dir / name, bare / name)
        with pytest.raises(BuunError) as exc:
            convert.run_converter(converter_python, bare, None, tmp_path / "x.gguf", "bf16", tmp_path / "c.log")
        text = str(exc.value)
        assert "has no tokenizer" in text and "tokenizer.json" in text and "Qwen/Qwen3.5-27B" in text


def test_a_convert_waits_for_the_converter_environment_being_made(converter_python: Path, holders, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    # the first converts of two models folders made it at once, each removing the other's half-made one
    made = converter_python.parent.parent
    env_dir = tmp_path / "cache" / made.name
    monkeypatch.setenv("BUUN_CACHE_DIR", str(env_dir.parent))
    holder = holders(f"converter-env:{env_dir}")  # a convert of another folder, making it
    code = "from buun_tool.pipeline import convert; print(convert.converter_python())"
    proc = subprocess.Popen([sys.executable, "-c", code],
                            env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = stderr_until(proc, "...")
        assert f"(PID {holder.pid}) to finish with the converter environment {env_dir}" in seen, seen
        (env_dir / "bin").mkdir(parents=True)  # what the holder makes: the interpreter, then its stamp
        (env_dir / "bin" / "python").symlink_to(converter_python)
        shutil.copyfile(made / convert.ENV_STAMP, env_dir / convert.ENV_STAMP)
        release(holder)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == str(env_dir / "bin" / "python"), err
    assert "creating the converter environment" not in err
