"""A recipe's schema: every key it may have, the values each takes and the llama-server flags it
may not set; parse() turns a recipe's YAML data into a Recipe or a RecipeError naming the file, the
dotted field and what is expected."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from buun_tool.base import command, paths
from buun_tool.formats.recipe_geometry import validate_geometry
from buun_tool.formats.recipe_reader import Reader, is_index
from buun_tool.formats.recipe_types import GEOMETRY_KEYS, Recipe, RecipeError

QUANT_TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "F16", "BF16")
# llama-server slots buun serves and plans (server.slots, --slots): the most the harness checks
# (tests/test_slots.py runs 2, 4 and 8 at once)
MAX_SLOTS = 8


# A flag's spelling: a recipe's key becomes one word of llama-server's command line.
_FLAG_NAME = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_-]*")


# llama-server flags a recipe may not set: they name a program, a file, a folder or a source on the
# network for llama-server to run, write, serve or load, and a recipe is a file anyone may hand on
# (`buun serve --recipe their.yaml`). A loopback server needs no API key, so `--tools` would let
# every user of the machine run shell commands as this one. The user's own flags after `--` may
# still name them. (The pinned llama.cpp's common/arg.cpp, every spelling.)
RECIPE_REFUSED: dict[str, str] = {
    **dict.fromkeys(("--tools", "--tools-runtime"), "lets every client run shell commands and read and write files"),
    **dict.fromkeys(("--mcp-servers-config", "--mcp-servers-json"), "starts the programs it names (MCP servers)"),
    **dict.fromkeys(("--ui-mcp-proxy", "--webui-mcp-proxy"), "relays clients' requests to other servers"),
    "--props": "lets every client change the server's settings (POST /props)",
    "--path": "serves the files of the folder it names to every client",
    "--media-path": "lets every client read the files of the folder it names",
    "--slot-save-path": "lets every client write files into the folder it names",
    **dict.fromkeys(("--ui-config-file", "--webui-config-file", "--chat-template-file"),
                    "shows the file it names to every client"),
    **dict.fromkeys(("--log-file", "--log-prompts-dir", "--logits-output-dir"), "writes where it says"),
    **dict.fromkeys(("-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "--spec-draft-hf",
                     "-hfd", "-hfrd", "--hf-repo-draft", "-mmu", "--mmproj-url", "--server-base"),
                    "downloads from the network"),
    **dict.fromkeys(("-mm", "--mmproj", "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled",
                     "--models-dir", "--models-preset"), "loads weights from a file other than the recipe's models"),
}


# Every key a recipe may have: a set lists the keys of a mapping, a dict the mappings below it.
# geometry takes any other key as a scale (`tiny`) with optional target/drafter overrides, and
# server.flags any llama-server flag; parse() checks those two itself.
_KEYS: dict[str, Any] = {
    "name": None, "description": None, "quantize": None,
    "target": {"repo", "revision", "gguf"},
    "drafter": {"repo", "revision", "files"},
    "tokenizer": {"repo", "revision", "files", "target_config"},
    "expect": {"block_size", "mask_token_id", "target_layer_ids", "hidden_size"},
    "geometry": dict(GEOMETRY_KEYS),
    "server": {"flags": None, "tree": {"budget", "k"}, "slots": None, "gpus": None},
}


def _unknown(source: Path, dotted: str, key: Any, valid: Iterable[str]) -> RecipeError:
    """`server.flag: unknown key (did you mean server.flags?)`; else the valid keys."""
    valid = sorted(valid)
    near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    where = f"{dotted}.{key}" if dotted else str(key)
    prefix = f"{dotted}." if dotted else ""
    hint = f"did you mean {prefix}{near[0]}?" if near else f"valid: {', '.join(valid)}"
    return RecipeError(f"{source}: {where}: unknown key ({hint})",
                       "every key is described in recipes/README.md")


def _check_keys(r: Reader, node: Any, allowed: Any, dotted: str = "") -> None:
    """Refuse a key the recipe schema does not know, at any depth (a misspelt key would be ignored)."""
    if allowed is None:
        return
    if not isinstance(node, dict):
        raise r.fail(dotted, "a mapping", node)
    for key, value in node.items():
        if key in allowed:
            below = f"{dotted}.{key}" if dotted else str(key)
            _check_keys(r, value, allowed[key] if isinstance(allowed, dict) else None, below)
        elif dotted == "geometry" and not difflib.get_close_matches(str(key), list(GEOMETRY_KEYS), n=1, cutoff=0.6):
            _check_keys(r, value, allowed, f"geometry.{key}")  # a scale: target/drafter overrides
        else:
            raise _unknown(r.source, dotted, key, allowed)

def _tree(r: Reader) -> tuple[int, int]:
    """server.tree's budget (0 or more; 0 and 1 are the chain) and K (1 or more)."""
    budget = r.get("server.tree.budget", int, 0)
    if budget < 0:
        raise r.fail("server.tree.budget", "0 (the chain) or a number of draft nodes", budget)
    k = r.get("server.tree.k", int, 8)
    if k < 1:
        raise r.fail("server.tree.k", "a positive number of candidates per draft depth", k)
    return budget, k


def _slots(r: Reader) -> int:
    """server.slots: 1 to MAX_SLOTS requests at once."""
    n = r.get("server.slots", int, 1)
    if not 1 <= n <= MAX_SLOTS:
        raise r.fail("server.slots", f"a number of slots from 1 to {MAX_SLOTS}", n)
    return n


def _gpus(r: Reader) -> tuple[int, ...]:
    """server.gpus: nvidia-smi indices, each once (`buun serve --gpus` checks them against the cards)."""
    items = r.get("server.gpus", list, [])
    if not all(map(is_index, items)):
        raise r.fail("server.gpus", "a list of nvidia-smi card indices, such as [0, 1]", items)
    if len(set(items)) != len(items):
        raise r.fail("server.gpus", "each card once", items)
    return tuple(items)


def _server_flags(r: Reader) -> dict[str, Any]:
    """server.flags: llama-server flags, each one argv word with one value, none of RECIPE_REFUSED."""
    source = r.source
    flags = r.get("server.flags", dict, {})
    for flag, value in flags.items():
        if not isinstance(flag, str) or not flag.startswith("-"):
            raise r.fail(f"server.flags.{flag}", "a llama-server flag starting with '-'", flag)
        if not _FLAG_NAME.fullmatch(flag):  # one argv word, as llama-server spells its flags
            raise r.fail(f"server.flags.{flag}", "one llama-server flag: '-' or '--' and a name, without "
                         "spaces or '='", flag)
        refused = RECIPE_REFUSED.get(flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag)
        if refused and value is not False:
            raise RecipeError(f"{source}: server.flags.{flag}: a recipe may not set {flag}: it {refused}",
                              f"leave it out of the recipe; to use it on purpose, give it yourself after `--` "
                              f"(`buun serve --recipe {source} -- {flag} ...`)")
        if isinstance(value, (list, dict)):  # would reach llama-server as its Python repr
            raise r.fail(f"server.flags.{flag}", "one value (a string or number), true or false", value)
        # A value that is a flag makes the flag before it a switch and itself the next option: a
        # recipe's `--jinja: -m` would name the model (or --host, --rpc) past buun's own checks.
        if isinstance(value, str) and command.looks_like_flag(value):
            raise r.fail(f"server.flags.{flag}", "a value, not another flag (each flag is a key of its own; "
                         "a switch is `true`)", value)
    return flags


def parse(source: Path, data: Any) -> Recipe:
    """The Recipe in `data` (the YAML read from `source`), every field checked."""
    r = Reader(source, data)
    _check_keys(r, r.data, _KEYS)
    name = r.get("name", str)
    if not paths.FOLDER_NAME.fullmatch(name):  # it names the drafter's GGUF folder, its log, the instance
        raise r.fail("name", paths.FOLDER_NAME_RULE, name)
    quant = r.get("quantize", str, "Q4_K_M").upper()
    if quant not in QUANT_TYPES:
        raise r.fail("quantize", f"one of {', '.join(QUANT_TYPES)}", quant)
    expect = r.get("expect", dict, {})
    for key in ("block_size", "mask_token_id", "hidden_size"):
        if key in expect:
            r.get(f"expect.{key}", int)
    ids = r.get("expect.target_layer_ids", list, [])
    if not all(map(is_index, ids)):  # [true] equals [1]
        raise r.fail("expect.target_layer_ids", "a list of layer indices (integers >= 0)", ids)
    flags = _server_flags(r)
    tree_budget, tree_k = _tree(r)
    return Recipe(
        name=name,
        description=r.get("description", str, ""),
        source=source,
        target=r.repo("target", (r.repo_path("target.gguf", r.get("target.gguf", str)),)),
        drafter=r.repo("drafter"),
        tokenizer=r.repo("tokenizer"),
        target_config=r.repo_path("tokenizer.target_config", r.get("tokenizer.target_config", str, "config.json")),
        quantize=quant,
        expect=dict(expect),
        geometry=validate_geometry(r),
        server_flags=dict(flags),
        tree_budget=tree_budget,
        tree_k=tree_k,
        slots=_slots(r),
        gpus=_gpus(r),
    )
