"""Recipes: the shipped one loads; every validation error names the file and the dotted field;
`buun recipes` lists name, description and source file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from buun_tool.base import paths
from buun_tool.base.errors import Exit, UsageError
from buun_tool.cli.app import app
from buun_tool.formats import recipes


def _shipped_text() -> str:
    return recipes.load().source.read_text()


def _shipped() -> dict[str, Any]:
    return yaml.safe_load(_shipped_text())


def _write(tmp_path: Path, data: Any, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


def test_shipped_recipe_loads():
    r = recipes.load()
    assert r.name == recipes.DEFAULT_RECIPE and r.quantize == "Q4_K_M"
    assert r.target.repo == "unsloth/Qwen3.5-27B-GGUF" and r.target_gguf.endswith(".gguf")
    assert r.drafter.files == ("config.json", "model.safetensors")
    # the target's config.json comes with the tokenizer files, from the tokenizer repo
    assert r.repos()["tokenizer"].files[-1] == "config.json"
    assert "config.json" not in r.tokenizer.files
    assert r.expect["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert (r.tree_budget, r.tree_k) == (0, 8)  # the chain until a tree is measured to beat it
    assert r.slots == 1 and "-np" not in r.server_flags  # one request at a time unless asked (--slots)


def test_tiny_geometry_keeps_the_structure():
    geo = recipes.load().geometry_at("tiny")
    assert geo.target.hidden_size == geo.drafter.hidden_size
    assert all(i < geo.target.num_hidden_layers for i in geo.drafter.target_layer_ids)
    assert geo.drafter.block_size == 16  # unchanged from the full geometry
    assert geo.target.mrope_section == (11, 11, 10)  # typed: lists become tuples


@pytest.mark.parametrize(("dotted", "value", "expected"), [
    ("target.repo", _DELETE, "target.repo: expected a string (field missing)"),
    ("drafter.repo", "no-slash", "drafter.repo: expected 'owner/name', got 'no-slash'"),
    ("drafter.files", ["config.json", 3], "drafter.files: expected a list of file names"),
    ("quantize", "Q3_XYZ", "quantize: expected one of Q4_K_M"),
    ("geometry.target.hidden_size", "big", "geometry.target.hidden_size: expected an integer, got 'big'"),
    ("geometry.drafter.block_size", 0, "geometry.drafter.block_size: expected a positive integer, got 0"),
    ("geometry.drafter.target_layer_ids", [1, 99], "geometry.drafter.target_layer_ids: expected layer indices"),
    ("geometry.drafter.target_layer_ids", [], "geometry.drafter.target_layer_ids: expected a list of integers"),
    ("geometry.target.rope_theta", -1.0, "geometry.target.rope_theta: expected a positive number, got -1.0"),
    # a scale's overrides are typed too, under their own key
    ("geometry.tiny.target.vocab_size", "4k", "geometry.tiny.target.vocab_size: expected an integer, got '4k'"),
    ("expect.mask_token_id", "248070", "expect.mask_token_id: expected an integer"),
    ("expect.mask_token_id", True, "expect.mask_token_id: expected an integer, got True"),
    ("expect.target_layer_ids", [1, True, 5],
     "expect.target_layer_ids: expected a list of layer indices (integers >= 0)"),
    # YAML's `revision: yes` is true, not a branch or tag name: it was fetched as revision "True"
    ("drafter.revision", True, "drafter.revision: expected a string or integer, got True"),
    ("server.tree.budget", -1, "server.tree.budget: expected 0 (the chain) or a number of draft nodes, got -1"),
    ("server.tree.budget", "22", "server.tree.budget: expected an integer, got '22'"),
    ("server.tree.k", 0, "server.tree.k: expected a positive number of candidates per draft depth, got 0"),
    ("server.slots", 0, "server.slots: expected a number of slots from 1 to 8, got 0"),
    ("server.slots", 9, "server.slots: expected a number of slots from 1 to 8, got 9"),
])
def test_validation_errors_name_file_and_field(tmp_path: Path, dotted: str, value: Any, expected: str):
    path = _write(tmp_path, _set(_shipped(), dotted, value))
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load(str(path))
    assert info.value.message.startswith(f"{path}: ")
    assert expected in info.value.message
    assert info.value.exit_code == Exit.USAGE


def _rename(data: dict[str, Any], dotted: str, new: str) -> dict[str, Any]:
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    node[new] = node.pop(last)
    return data


@pytest.mark.parametrize(("dotted", "new", "expected"), [
    # `server: {flag: ...}` used to load with no flags: served without --spec-type dflash
    ("server.flags", "flag", "server.flag: unknown key (did you mean server.flags?)"),
    ("quantize", "quantise", "quantise: unknown key (did you mean quantize?)"),
    ("target.revision", "revison", "target.revison: unknown key (did you mean target.revision?)"),
    ("geometry.tiny.drafter.target_layer_ids", "target_layers_ids",
     "geometry.tiny.drafter.target_layers_ids: unknown key (did you mean geometry.tiny.drafter.target_layer_ids?)"),
    ("geometry.target", "targte", "geometry.targte: unknown key (did you mean geometry.target?)"),
    ("expect.block_size", "blocksize", "expect.blocksize: unknown key (did you mean expect.block_size?)"),
    ("server.tree.budget", "budjet", "server.tree.budjet: unknown key (did you mean server.tree.budget?)"),
])
def test_unknown_keys_are_errors_with_the_nearest_valid_key(tmp_path: Path, dotted: str, new: str, expected: str):
    path = _write(tmp_path, _rename(_shipped(), dotted, new))
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load(str(path))
    assert info.value.message == f"{path}: {expected}"
    assert info.value.exit_code == Exit.USAGE


def test_an_unknown_key_with_no_near_one_lists_the_valid_keys(tmp_path: Path):
    path = _write(tmp_path, _set(_shipped(), "server.port", 8080))
    with pytest.raises(recipes.RecipeError, match=r"server\.port: unknown key \(valid: flags, gpus, slots, tree\)"):
        recipes.load(str(path))


@pytest.mark.parametrize(("dotted", "value", "expected"), [
    ("server.flags.-c", [4096, 8192], "server.flags.-c: expected one value (a string or number), true or false"),
    ("server.flags.-ot", {"a": "CPU"}, "server.flags.-ot: expected one value"),
    ("drafter.files", [], "drafter.files: expected at least one file name"),
    # a file's path in its repository, joined under the models folder: it must stay there
    ("target.gguf", "../../../../tmp/x.gguf", "target.gguf: expected a file's path inside the repository"),
    ("target.gguf", "/etc/x.gguf", "target.gguf: expected a file's path inside the repository"),
    ("drafter.files", ["config.json", "sub/../../x"], "drafter.files: expected a file's path inside the repository"),
    ("tokenizer.files", ["tokenizer.json", "a//b.json"], "tokenizer.files: expected a file's path inside"),
    ("tokenizer.files", ["..\\x.json"], "tokenizer.files: expected a file's path inside the repository"),
    ("tokenizer.target_config", "./config.json", "tokenizer.target_config: expected a file's path inside"),
    ("tokenizer.files", [], "tokenizer.files: expected at least one file name"),
    ("server", ["--jinja"], "server: expected a mapping"),
    # a value that is a flag would be llama-server's next option: the model, the address, past buun's checks
    ("server.flags.--jinja", "-m", "server.flags.--jinja: expected a value, not another flag"),
    ("server.flags.-ngl", "--host", "server.flags.-ngl: expected a value, not another flag"),
    ("server.flags.--jinja --no-mmap", True, "server.flags.--jinja --no-mmap: expected one llama-server flag"),
    ("server.flags.--rpc=10", True, "server.flags.--rpc=10: expected one llama-server flag"),
    # the name becomes the converted drafter's folder (models/gguf/NAME), its log and the instance
    ("name", "../../../../tmp/evil", "name: expected letters, digits, '.', '_' and '-' (up to 64)"),
    ("name", ".hidden", "name: expected letters, digits"),
    ("name", "a b", "name: expected letters, digits"),
])
def test_values_that_cannot_be_used_are_refused(tmp_path: Path, dotted: str, value: Any, expected: str):
    path = _write(tmp_path, _set(_shipped(), dotted, value))
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load(str(path))
    assert info.value.message.startswith(f"{path}: {expected}")


DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


@pytest.mark.parametrize(("scale", "role", "changes", "expected"), [
    (None, "drafter", {"hidden_size": 4096},
     "geometry.drafter.hidden_size: expected geometry.target.hidden_size (5120)"),
    # the value that breaks the rule is named where it is written: the override, or the base it inherits
    ("tiny", "drafter", {"hidden_size": 512},
     "geometry.tiny.drafter.hidden_size: expected geometry.tiny.target.hidden_size (256)"),
    ("tiny", "target", {"vocab_size": 4096},
     "geometry.drafter.mask_token_id: expected an id in [248047, 4096)"),
    (None, "target", {"linear_value_head_dim": 64}, "geometry.target.linear_value_head_dim: expected"),
    (None, "target", {"linear_num_value_heads": 40}, "geometry.target.linear_num_value_heads: expected a multiple"),
    (None, "target", {"mrope_section": [11, 11, 11]}, "geometry.target.mrope_section: expected sections summing"),
    (None, "drafter", {"target_layer_ids": [1, 63]}, "geometry.drafter.target_layer_ids: expected layer indices in"),
    # a DFlash2 drafter's keys: all four, channels in whole groups, the selector's lattice in one row
    (None, "drafter", {"selector_top_k": 16},
     "geometry.drafter.conv_kernel_size, geometry.drafter.conv_group_size, geometry.drafter.selector_rank: "
     "expected with geometry.drafter.selector_top_k"),
    (None, "drafter", {**DFLASH2, "conv_group_size": 48}, "geometry.drafter.conv_group_size: expected a divisor"),
    (None, "drafter", {**DFLASH2, "selector_top_k": 72}, "geometry.drafter.selector_top_k: expected top_k * (top_k"),
])
def test_geometry_rules_run_on_load(tmp_path: Path, scale: str | None, role: str, changes: dict[str, Any],
                                    expected: str):
    """The cross-field rules `buun synth` and `buun fit` depend on are the loader's: every command refuses."""
    data = _shipped()
    (data["geometry"][scale] if scale else data["geometry"])[role].update(changes)
    path = _write(tmp_path, data)
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load(str(path))
    assert info.value.message.startswith(f"{path}: {expected}")


def test_unknown_scale_names_the_valid_ones():
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load().geometry_at("huge")
    assert "geometry.huge: no such scale" in info.value.message and info.value.hint == "valid: full, tiny"


def test_a_file_in_a_repository_subfolder_is_a_path_inside_the_models_folder(tmp_path: Path):
    """Hub repositories keep files in folders (a split GGUF's parts, say): a relative path is fine."""
    path = _write(tmp_path, _set(_shipped(), "target.gguf", "Q4_K_M/Qwen3.5-27B-Q4_K_M.gguf"))
    r = recipes.load(str(path))
    assert r.target_gguf == "Q4_K_M/Qwen3.5-27B-Q4_K_M.gguf" and r.target.files == ("Q4_K_M/Qwen3.5-27B-Q4_K_M.gguf",)


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--tools", "all", "it lets every client run shell commands"),
    ("--mcp-servers-json", '{"mcpServers": {"x": {"command": "sh"}}}', "it starts the programs it names"),
    ("--path", "/", "it serves the files of the folder it names to every client"),
    ("--slot_save_path", "/tmp", "it lets every client write files"),  # llama-server reads '_' as '-'
    ("--chat-template-file", "/etc/passwd", "it shows the file it names to every client"),
    ("--log-file", "/tmp/x", "it writes where it says"),
    ("-hf", "someone/model", "it downloads from the network"),
    ("--lora", "/tmp/x.gguf", "it loads weights from a file other than the recipe's models"),
    ("--props", True, "it lets every client change the server's settings"),
])
def test_a_recipe_may_not_hand_the_server_to_its_clients(tmp_path: Path, flag: str, value: Any, why: str):
    """A recipe is a file anyone may hand on: a loopback server needs no API key, so with `--tools`
    every user of the machine could run shell commands as this one."""
    path = _write(tmp_path, _set(_shipped(), f"server.flags.{flag}", value))
    res = CliRunner().invoke(app, ["drafter", str(path)])
    assert res.exit_code == Exit.USAGE, res.output
    assert f"{path}: server.flags.{flag}: a recipe may not set {flag}: {why}" in res.stderr
    assert "give it yourself after `--`" in res.stderr


def test_a_recipe_may_turn_such_a_flag_off(tmp_path: Path):
    data = _set(_shipped(), "server.flags.--no-props", True)
    r = recipes.load(str(_write(tmp_path, _set(data, "server.flags.--tools", False))))
    assert r.server_flags["--no-props"] is True


def test_a_negative_number_is_a_value(tmp_path: Path):
    r = recipes.load(str(_write(tmp_path, _set(_shipped(), "server.flags.--reasoning-budget", "-1"))))
    assert r.server_flags["--reasoning-budget"] == "-1"


def test_server_flag_must_look_like_a_flag(tmp_path: Path):
    data = _shipped()
    data["server"]["flags"]["ngl"] = 99
    with pytest.raises(recipes.RecipeError, match=r"server\.flags\.ngl: expected a llama-server flag"):
        recipes.load(str(_write(tmp_path, data)))


def test_not_yaml_and_not_a_mapping(tmp_path: Path):
    with pytest.raises(recipes.RecipeError, match="not valid YAML"):
        recipes.load(str(_write(tmp_path, "name: [unclosed\n")))
    with pytest.raises(recipes.RecipeError, match="expected a mapping at the top level, got list"):
        recipes.load(str(_write(tmp_path, "- a\n- b\n")))


def test_a_file_that_is_not_a_recipe_is_named_for_what_it_is(tmp_path: Path):
    """Text in another encoding (a UnicodeDecodeError traceback before), an empty file (was "got
    NoneType") and a folder (was "unknown recipe") each say what is wrong, as usage errors: in
    `buun serve` and in `buun recipes`, which lists the user's recipes."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(_shipped_text().replace("description: ", "description: caf\xe9 ").encode("latin-1"))
    empty = _write(tmp_path, "# nothing yet\n", "empty.yaml")
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    for given, expected in ((latin, f"{latin}: not UTF-8 text (invalid continuation byte at byte "),
                            (empty, f"{empty}: the file is empty"),
                            (folder, f"{folder} is a folder, not a recipe file"),
                            (tmp_path, f"{tmp_path} is a folder, not a recipe file")):
        res = CliRunner().invoke(app, ["serve", "--print-cmd", str(given)])
        assert res.exit_code == Exit.USAGE and res.stderr.startswith(f"error: {expected}"), res.output
    user = paths.config_dir() / "recipes"
    user.mkdir(parents=True)
    (user / "latin.yaml").write_bytes(latin.read_bytes())
    res = CliRunner().invoke(app, ["recipes", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert "not UTF-8 text" in rows["latin"]["error"] and rows[recipes.DEFAULT_RECIPE]["error"] is None


def test_unknown_name_lists_the_known_recipes():
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load("no-such-recipe")
    assert "unknown recipe 'no-such-recipe'" in info.value.message
    assert recipes.DEFAULT_RECIPE in (info.value.hint or "")


def test_missing_file_points_to_buun_recipes(tmp_path: Path):
    with pytest.raises(recipes.RecipeError) as info:
        recipes.load(str(tmp_path / "gone.yaml"))
    assert "does not exist" in info.value.message and "buun recipes" in (info.value.hint or "")


def test_a_user_recipe_overrides_the_shipped_one():
    user = paths.config_dir() / "recipes"
    user.mkdir(parents=True)
    data = _shipped()
    data["description"] = "mine"
    _write(user, data, f"{recipes.DEFAULT_RECIPE}.yaml")
    assert recipes.load().description == "mine"
    assert recipes.load().source == user / f"{recipes.DEFAULT_RECIPE}.yaml"


def test_a_file_in_the_current_folder_named_like_a_recipe_does_not_replace_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """`buun setup` (the default recipe) or `buun serve NAME` run in a folder someone else filled (a
    cloned repository) must not take a file there named like the recipe for it: its repos and server
    flags would be the stranger's. The file is loaded when given as a path."""
    shipped = recipes.load().source
    planted = _shipped()
    planted["target"]["repo"] = "stranger/Qwen3.5-27B-GGUF"
    _write(tmp_path, planted, recipes.DEFAULT_RECIPE)
    monkeypatch.chdir(tmp_path)
    assert recipes.load().source == shipped and recipes.load(recipes.DEFAULT_RECIPE).source == shipped
    assert recipes.load().target.repo == "unsloth/Qwen3.5-27B-GGUF"
    assert recipes.load(f"./{recipes.DEFAULT_RECIPE}").target.repo == "stranger/Qwen3.5-27B-GGUF"


class TestCli:
    def test_recipes_json(self):
        res = CliRunner().invoke(app, ["recipes", "--json"])
        assert res.exit_code == 0, res.output
        rows = json.loads(res.stdout)
        shipped = next(r for r in rows if r["name"] == recipes.DEFAULT_RECIPE)
        assert shipped["source"] == str(paths.recipes_dir() / f"{recipes.DEFAULT_RECIPE}.yaml")
        assert shipped["description"].startswith("Qwen3.5-27B") and shipped["error"] is None

    def test_a_broken_recipe_is_listed_with_its_error_and_hides_no_other(self):
        user = paths.config_dir() / "recipes"
        user.mkdir(parents=True)
        _write(user, _set(_shipped(), "quantize", "Q1"), "broken.yaml")
        res = CliRunner().invoke(app, ["recipes", "--json"])
        assert res.exit_code == 0, res.output
        rows = {r["name"]: r for r in json.loads(res.stdout)}
        assert "quantize: expected one of" in rows["broken"]["error"]
        assert rows[recipes.DEFAULT_RECIPE]["error"] is None

    def test_a_recipe_with_a_bad_geometry_is_listed_as_invalid_as_fit_refuses_it(self):
        """`buun recipes` judges the geometry by the rules `buun fit` (and synth, setup) need."""
        user = paths.config_dir() / "recipes"
        user.mkdir(parents=True)
        data = _shipped()
        data["name"] = "bad-geometry"
        data["geometry"]["tiny"]["drafter"]["hidden_size"] = 512
        path = _write(user, data, "bad-geometry.yaml")
        res = CliRunner().invoke(app, ["recipes", "--json"])
        assert res.exit_code == 0, res.output
        error = {r["name"]: r for r in json.loads(res.stdout)}["bad-geometry"]["error"]
        assert error.startswith(f"{path}: geometry.tiny.drafter.hidden_size: expected ")
        fit = CliRunner().invoke(app, ["fit", "bad-geometry", "--gpu-mem", "24"])
        assert fit.exit_code == Exit.USAGE and error in fit.stderr

    def test_recipes_table(self):
        res = CliRunner().invoke(app, ["recipes"])
        assert res.exit_code == 0 and recipes.DEFAULT_RECIPE in res.stdout

    def test_a_narrow_terminal_folds_a_table_and_cuts_nothing(self):
        """On a terminal of 40 columns rich cut the recipe's name and file to `qwen3.5-27…` and
        `/tmp/wt-ne…`: each cell now goes on over the next lines, whole."""
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "COLUMNS": "40",
               "FORCE_COLOR": "1", "NO_COLOR": "1"}  # a terminal to rich, without colours
        res = subprocess.run([sys.executable, "-m", "buun_tool", "recipes"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in res.stdout.splitlines()]
        assert "…" not in res.stdout and max(map(len, lines)) <= 40, res.stdout
        at = lines[0].index(" file") + 1  # the last column: its cells' pieces, top to bottom
        shipped = sorted(recipes.load().source.parent.glob("*.yaml"))
        assert "".join(ln[at:].strip() for ln in lines[1:]) == "".join(map(str, shipped)), res.stdout
        name_at, end = lines[0].index(" name") + 1, lines[0].index(" description")
        names = "".join(ln[name_at:end].strip() for ln in lines[1:])
        assert all(p.stem in names for p in shipped) and recipes.DEFAULT_RECIPE in names, res.stdout

    def test_a_bad_recipe_file_is_a_usage_error(self, tmp_path: Path):
        path = _write(tmp_path, _set(_shipped(), "drafter.repo", "x"))
        res = CliRunner().invoke(app, ["drafter", str(path)])
        assert res.exit_code == Exit.USAGE and "drafter.repo" in res.output

    def test_error_text_is_printed_literally_and_whole(self, tmp_path: Path):
        """A YAML parser message keeps its `[` and `]` (not read as markup), and a long path is not
        wrapped: CliRunner's output is not a terminal, like a CI log or a pipe."""
        deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "recipe-with-a-long-name.yaml"
        deep.parent.mkdir(parents=True)
        deep.write_text("name: [unclosed\n")
        res = CliRunner().invoke(app, ["drafter", str(deep)])
        assert res.exit_code == Exit.USAGE
        assert f"error: {deep}: not valid YAML: while parsing a flow sequence\n" in res.stderr
        assert "    name: [unclosed\n" in res.stderr and "expected ',' or ']', but got '<stream end>'" in res.stderr

    def test_a_table_keeps_paths_and_errors_whole(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
        """`buun recipes` in a pipe: the file column is not cut to 80 columns, and a broken recipe's
        YAML error keeps its brackets."""
        config = tmp_path / ("a-long-config-folder-" * 4)
        monkeypatch.setenv("BUUN_CONFIG_DIR", str(config))
        user = config / "recipes"
        user.mkdir(parents=True)
        _write(user, "name: [unclosed\n", "broken.yaml")
        res = CliRunner().invoke(app, ["recipes"])
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert any(ln.rstrip().endswith(f"{user / 'broken.yaml'}: not valid YAML: while parsing a flow sequence  "
                                        f"{user / 'broken.yaml'}") for ln in lines), res.stdout
        assert "name: [unclosed" in res.stdout and "expected ',' or ']', but got '<stream end>'" in res.stdout
        assert any(str(paths.recipes_dir() / f"{recipes.DEFAULT_RECIPE}.yaml") in ln for ln in lines)


def _aliases(levels: int) -> str:
    """A YAML list whose anchors each repeat the one before ten times: `levels` lines, 10**levels
    leaves once expanded (aliases share one object: loading it costs nothing)."""
    rows = ["  - &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(rows)


@pytest.mark.parametrize(("dotted", "expected"), [
    ("server.flags.-c", "server.flags.-c: expected one value"),
    ("server.gpus", "server.gpus: expected a list of nvidia-smi card indices"),
    ("expect.target_layer_ids", "expect.target_layer_ids: expected a list of layer indices"),
])
def test_a_value_of_yaml_aliases_is_quoted_short(tmp_path: Path, dotted: str, expected: str):
    """Each level multiplies the value's text by ten: quoted whole, a recipe of 9 such lines (500
    bytes) asked for gigabytes; 6 show it here in a second and 5 MB."""
    *parents, last = dotted.split(".")
    text = yaml.safe_dump(_shipped(), sort_keys=False)
    data = yaml.safe_load(text)
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = "BOMB"
    text = yaml.safe_dump(data, sort_keys=False).replace(
        f"{last}: BOMB", f"{last}:\n" + _aliases(6).replace("  - ", " " * (2 * len(parents) + 2) + "- "))
    path = _write(tmp_path, text)
    res = CliRunner().invoke(app, ["drafter", str(path)])
    assert res.exit_code == Exit.USAGE, res.output
    assert expected in res.stderr and len(res.stderr) < 2000


@pytest.mark.parametrize(("after", "added", "dotted"), [
    # a second `server:` block at the end: PyYAML kept it alone, the first's flags (DFlash's) gone
    (None, "server:\n  slots: 2\n", "server"),
    ("    --spec-type: dflash\n", "    --spec-type: none\n", "server.flags.--spec-type"),
    ("    budget: 0\n", "    budget: 22\n", "server.tree.budget"),
])
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path, after: str | None, added: str, dotted: str):
    """`buun serve` with a recipe of two `server:` blocks served without --spec-type dflash: a
    repeated key at any level is a usage error naming the file, the key and both lines."""
    text = _shipped_text()
    if after is None:
        first, second = text.splitlines().index("server:") + 1, len(text.splitlines()) + 1
        text += added
    else:
        cut = text.index(after) + len(after)
        first, second = text[:cut].count("\n"), text[:cut].count("\n") + 1
        text = text[:cut] + added + text[cut:]
    path = _write(tmp_path, text)
    res = CliRunner().invoke(app, ["serve", "--print-cmd", str(path)])
    assert res.exit_code == Exit.USAGE, res.output
    assert res.stderr.startswith(f"error: {path}: {dotted} is given twice, at lines {first} and {second}: "), res.stderr
    assert f"keep one `{dotted.rpartition('.')[2]}:`" in res.stderr


def test_keys_merged_from_an_anchor_may_be_overridden(tmp_path: Path):
    """`<<: *base` then a key of its own is YAML's way to override, not a repeated key."""
    text = _shipped_text().replace("  tree:\n    budget: 0\n    k: 8\n",
                                   "  tree:\n    <<: &t {budget: 4, k: 8}\n    budget: 0\n")
    assert "<<: &t" in text
    assert recipes.load(str(_write(tmp_path, text))).tree_budget == 0


def test_a_pin_file_with_a_key_given_twice_is_refused(tmp_path: Path):
    from buun_tool.pipeline import vendor

    pin = tmp_path / "pin.yaml"
    text = paths.pin_file().read_text()
    pin.write_text(text + "commit: 0000000000000000000000000000000000000000\n")
    first = text.splitlines().index(f"commit: {vendor.load_pin().commit}") + 1
    with pytest.raises(UsageError) as info:
        vendor.load_pin(pin)
    assert info.value.message == (f"{pin}: commit is given twice, at lines {first} and {len(text.splitlines()) + 1}: "
                                  "YAML would keep the second and drop the first without a word")
    assert info.value.exit_code == Exit.USAGE
