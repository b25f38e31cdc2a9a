"""Recipes: one YAML file per model pair, validated on load.

A recipe says where the target, drafter and tokenizer come from, how the drafter is converted
and checked, the geometry of the real checkpoints (for synthetic models and the memory planner)
and the llama-server settings. Errors name the file, the dotted field and what is expected.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from buun_tool import paths
from buun_tool.errors import UsageError

DEFAULT_RECIPE = "qwen3.5-27b-dflash"
QUANT_TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "F16", "BF16")


class RecipeError(UsageError):
    pass


@dataclass(frozen=True)
class RepoSpec:
    repo: str
    revision: str = "main"
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    source: Path
    target: RepoSpec  # files = (the target GGUF,)
    drafter: RepoSpec
    tokenizer: RepoSpec
    target_config: str  # the target's config.json, fetched from the tokenizer repo
    quantize: str
    expect: dict[str, Any]
    geometry: dict[str, Any]
    server_flags: dict[str, Any] = field(default_factory=dict)
    tree_budget: int = 0  # server.tree.budget: draft nodes a DDTree step verifies; 0 or 1, the chain
    tree_k: int = 8  # server.tree.k: candidates per draft depth

    @property
    def target_gguf(self) -> str:
        return self.target.files[0]

    def repos(self) -> dict[str, RepoSpec]:
        """The Hub repos to pull, by role. The tokenizer repo also gives the target config."""
        tok = RepoSpec(self.tokenizer.repo, self.tokenizer.revision,
                       self.tokenizer.files + (self.target_config,))
        return {"target": self.target, "drafter": self.drafter, "tokenizer": tok}

    def geometry_for(self, scale: str) -> dict[str, dict[str, Any]]:
        """Target and drafter geometry at 'full' scale or a shrunk one ('tiny') of the same structure."""
        full = {k: dict(self.geometry[k]) for k in ("target", "drafter")}
        if scale == "full":
            return full
        over = self.geometry.get(scale)
        if not isinstance(over, dict):
            raise RecipeError(f"{self.source}: geometry.{scale}: no such scale",
                              f"valid: full, {', '.join(k for k in self.geometry if k not in ('target', 'drafter'))}")
        for k in ("target", "drafter"):
            full[k].update(over.get(k) or {})
        return full


# --- validation helpers ---------------------------------------------------------------------

class _Reader:
    def __init__(self, source: Path, data: Any):
        self.source = source
        if not isinstance(data, dict):
            raise RecipeError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
        self.data = data

    def fail(self, dotted: str, expected: str, got: Any = None) -> RecipeError:
        tail = f", got {got!r}" if got is not None else ""
        return RecipeError(f"{self.source}: {dotted}: expected {expected}{tail}")

    def get(self, dotted: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is not ...:
                    return default
                raise self.fail(dotted, f"a {_kind_name(kind)} (field missing)")
            node = node[part]
        if kind is float and isinstance(node, int) and not isinstance(node, bool):
            node = float(node)
        if not isinstance(node, kind) or (isinstance(node, bool) and kind in (int, float)):
            raise self.fail(dotted, f"a {_kind_name(kind)}", node)
        return node

    def str_list(self, dotted: str, default: Any = ...) -> tuple[str, ...]:
        items = self.get(dotted, list, default)
        if not items:
            raise self.fail(dotted, "at least one file name", items)
        if not all(isinstance(i, str) and i for i in items):
            raise self.fail(dotted, "a list of file names", items)
        return tuple(items)

    def repo(self, dotted: str, files: tuple[str, ...] | None = None) -> RepoSpec:
        repo = self.get(f"{dotted}.repo", str)
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            raise self.fail(f"{dotted}.repo", "'owner/name'", repo)
        rev = str(self.get(f"{dotted}.revision", (str, int), "main"))
        return RepoSpec(repo, rev, files if files is not None else self.str_list(f"{dotted}.files"))


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", list: "list", dict: "mapping", bool: "boolean"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


_GEOMETRY_INTS = {
    "target": ("hidden_size", "num_hidden_layers", "full_attention_interval", "intermediate_size",
               "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
               "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
               "linear_conv_kernel_dim", "vocab_size", "max_position_embeddings", "eos_token_id"),
    "drafter": ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "block_size", "mask_token_id"),
}
# The rest of the geometry (synth checks their values); the same names as synth's dataclasses.
_GEOMETRY_OTHER = {
    "target": ("partial_rotary_factor", "mrope_section", "rope_theta", "rms_norm_eps"),
    "drafter": ("rope_theta", "rms_norm_eps", "target_layer_ids"),
}
GEOMETRY_KEYS = {role: frozenset(_GEOMETRY_INTS[role] + _GEOMETRY_OTHER[role]) for role in _GEOMETRY_INTS}

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
    "server": {"flags": None, "tree": {"budget", "k"}},
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


def _check_keys(r: _Reader, node: Any, allowed: Any, dotted: str = "") -> None:
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


def _validate_geometry(r: _Reader) -> dict[str, Any]:
    geo = r.get("geometry", dict)
    for role, keys in _GEOMETRY_INTS.items():
        for key in keys:
            v = r.get(f"geometry.{role}.{key}", int)
            if v <= 0:
                raise r.fail(f"geometry.{role}.{key}", "a positive integer", v)
    ids = r.get("geometry.drafter.target_layer_ids", list)
    n_layers = geo["target"]["num_hidden_layers"]
    if not ids or not all(isinstance(i, int) and 0 <= i < n_layers for i in ids):
        raise r.fail("geometry.drafter.target_layer_ids", f"layer indices in [0, {n_layers})", ids)
    return geo


def _tree(r: _Reader) -> tuple[int, int]:
    """server.tree's budget (0 or more; 0 and 1 are the chain) and K (1 or more)."""
    budget = r.get("server.tree.budget", int, 0)
    if budget < 0:
        raise r.fail("server.tree.budget", "0 (the chain) or a number of draft nodes", budget)
    k = r.get("server.tree.k", int, 8)
    if k < 1:
        raise r.fail("server.tree.k", "a positive number of candidates per draft depth", k)
    return budget, k


def parse(source: Path, data: Any) -> Recipe:
    r = _Reader(source, data)
    _check_keys(r, r.data, _KEYS)
    name = r.get("name", str)
    quant = r.get("quantize", str, "Q4_K_M").upper()
    if quant not in QUANT_TYPES:
        raise r.fail("quantize", f"one of {', '.join(QUANT_TYPES)}", quant)
    expect = r.get("expect", dict, {})
    for key in ("block_size", "mask_token_id", "hidden_size"):
        if key in expect:
            r.get(f"expect.{key}", int)
    if "target_layer_ids" in expect:
        r.get("expect.target_layer_ids", list)
    flags = r.get("server.flags", dict, {})
    for flag, value in flags.items():
        if not isinstance(flag, str) or not flag.startswith("-"):
            raise r.fail(f"server.flags.{flag}", "a llama-server flag starting with '-'", flag)
        if isinstance(value, (list, dict)):  # would reach llama-server as its Python repr
            raise r.fail(f"server.flags.{flag}", "one value (a string or number), true or false", value)
    tree_budget, tree_k = _tree(r)
    return Recipe(
        name=name,
        description=r.get("description", str, ""),
        source=source,
        target=r.repo("target", (r.get("target.gguf", str),)),
        drafter=r.repo("drafter"),
        tokenizer=r.repo("tokenizer"),
        target_config=r.get("tokenizer.target_config", str, "config.json"),
        quantize=quant,
        expect=dict(expect),
        geometry=_validate_geometry(r),
        server_flags=dict(flags),
        tree_budget=tree_budget,
        tree_k=tree_k,
    )


def load_file(path: Path) -> Recipe:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RecipeError(f"recipe file {path} does not exist",
                          "run `buun recipes` to list the known recipes") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    return parse(path, data)


def available() -> dict[str, Path]:
    """Recipes shipped in recipes/ and the user's own in the config dir (theirs win)."""
    found: dict[str, Path] = {}
    for d in (paths.recipes_dir(), paths.config_dir() / "recipes"):
        if d.is_dir():
            for f in sorted(d.glob("*.yaml")):
                found[f.stem] = f
    return found


def load(name_or_path: str | None = None) -> Recipe:
    """A recipe by name (see `buun recipes`) or by path to a YAML file."""
    ref = name_or_path or DEFAULT_RECIPE
    as_path = Path(ref).expanduser()
    if ref.endswith((".yaml", ".yml")) or as_path.is_file():
        return load_file(as_path)
    known = available()
    if ref not in known:
        raise RecipeError(f"unknown recipe '{ref}'", f"known recipes: {', '.join(sorted(known)) or 'none'}; "
                          "or pass the path of a recipe file")
    return load_file(known[ref])
