"""Recipes: one YAML file per model pair, validated on load.

A recipe says where the target, drafter and tokenizer come from, how the drafter is converted
and checked, the geometry of the real checkpoints (for synthetic models and the memory planner)
and the llama-server settings. Errors name the file, the dotted field and what is expected.

The geometry is typed here (TargetGeometry, DrafterGeometry, one Geometry per scale) and its
cross-field rules run on load, so `buun recipes` refuses every recipe `buun synth`, `buun fit` or
`buun setup` would: they read `recipe.geometry_at(scale)`, built once.
"""

from __future__ import annotations

import difflib
import re
import reprlib
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from buun_tool.base import command, paths
from buun_tool.base.errors import UsageError

DEFAULT_RECIPE = "qwen3.5-27b-dflash"
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


class RecipeError(UsageError):
    pass


# A value quoted in an error is cut short: YAML aliases make a recipe of a few hundred bytes hold a
# list of a billion items (each anchor `&a [...]` repeated ten times by the next), whose whole repr
# would take all the memory there is.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 8, 8, 200, 200


def is_index(value: Any) -> bool:
    """A whole number of 0 or more, as JSON or YAML gives one: true and false are none, though
    Python's bool is an int (a config's `mask_token_id: true` was taken as token 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def shown(value: Any) -> str:
    """`value`'s repr, at most a few hundred characters whatever its size."""
    return _SHORT.repr(value)


@dataclass(frozen=True)
class RepoSpec:
    repo: str
    revision: str = "main"
    files: tuple[str, ...] = ()


# --- geometry ------------------------------------------------------------------------------
# The shapes of the real checkpoints, named as in their HF config.json: `buun synth` writes
# tensors of exactly these shapes and `buun fit` plans memory from them.

FULL = "full"  # the scale of the real checkpoints: geometry.target and geometry.drafter as written
# The real Qwen3.5 special tokens follow eos_token_id in this order; the drafter's mask token
# comes after them (`buun synth` writes its vocabulary so).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TargetGeometry:
    """The qwen35 hyper-parameters, named as in the HF config.json."""

    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    mrope_section: tuple[int, ...]
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    eos_token_id: int

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def n_full_attention(self) -> int:
        return sum(self.is_full_attention(i) for i in range(self.num_hidden_layers))


@dataclass(frozen=True)
class DrafterGeometry:
    """The DFlash drafter's hyper-parameters, named as in its config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]


@dataclass(frozen=True)
class Geometry:
    """The target and drafter of one scale."""

    target: TargetGeometry
    drafter: DrafterGeometry

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {"target": asdict(self.target), "drafter": asdict(self.drafter)}


_ROLES: dict[str, type] = {"target": TargetGeometry, "drafter": DrafterGeometry}
GEOMETRY_KEYS = {role: frozenset(f.name for f in fields(cls)) for role, cls in _ROLES.items()}


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
    geometry: dict[str, Geometry]  # by scale: "full" (the real checkpoints) and the recipe's shrinks
    server_flags: dict[str, Any] = field(default_factory=dict)
    tree_budget: int = 0  # server.tree.budget: draft nodes a DDTree step verifies; 0 or 1, the chain
    tree_k: int = 8  # server.tree.k: candidates per draft depth
    slots: int = 1  # server.slots: requests served at once (llama-server's -np)
    gpus: tuple[int, ...] = ()  # server.gpus: nvidia-smi indices of the cards to run on; () = as CUDA finds them

    @property
    def target_gguf(self) -> str:
        return self.target.files[0]

    @property
    def ref(self) -> str:
        """How a command names this recipe, for the hints (`buun pull REF`): see reference."""
        return reference(self.source)

    def repos(self) -> dict[str, RepoSpec]:
        """The Hub repos to pull, by role. The tokenizer repo also gives the target config."""
        tok = RepoSpec(self.tokenizer.repo, self.tokenizer.revision,
                       self.tokenizer.files + (self.target_config,))
        return {"target": self.target, "drafter": self.drafter, "tokenizer": tok}

    def geometry_at(self, scale: str) -> Geometry:
        """Target and drafter geometry at 'full' scale or a shrunk one ('tiny') of the same structure."""
        if scale not in self.geometry:
            raise RecipeError(f"{self.source}: geometry.{scale}: no such scale",
                              f"valid: {', '.join(self.geometry)}")
        return self.geometry[scale]


# --- validation helpers ---------------------------------------------------------------------

class _Reader:
    def __init__(self, source: Path, data: Any):
        self.source = source
        if not isinstance(data, dict):
            raise RecipeError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
        self.data = data

    def fail(self, dotted: str, expected: str, got: Any = None) -> RecipeError:
        tail = f", got {shown(got)}" if got is not None else ""
        return RecipeError(f"{self.source}: {dotted}: expected {expected}{tail}")

    def get(self, dotted: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is not ...:
                    return default
                raise self.fail(dotted, f"{_a(_kind_name(kind))} (field missing)")
            node = node[part]
        if kind is float and isinstance(node, int) and not isinstance(node, bool):
            node = float(node)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML's true (and yes) is a bool, and a bool an int to Python: only a boolean field takes one
        if not isinstance(node, kind) or (isinstance(node, bool) and bool not in kinds):
            raise self.fail(dotted, _a(_kind_name(kind)), node)
        return node

    def str_list(self, dotted: str, default: Any = ...) -> tuple[str, ...]:
        items = self.get(dotted, list, default)
        if not items:
            raise self.fail(dotted, "at least one file name", items)
        if not all(isinstance(i, str) and i for i in items):
            raise self.fail(dotted, "a list of file names", items)
        return tuple(self.repo_path(dotted, i) for i in items)

    def repo_path(self, dotted: str, value: str) -> str:
        """A file's path inside a Hub repository: relative, every part a name, so that the file, put
        at that path under the models folder, stays inside it (`../x` or `/etc/x` would not)."""
        if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in value.split("/")):
            raise self.fail(dotted, "a file's path inside the repository (relative, no '.', '..' or empty part)",
                            value)
        return value

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


def _a(noun: str) -> str:
    """`noun` after its article: "an integer", "a string"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


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


class _GeometryReader:
    """One scale's values, each read and named at the dotted key it comes from: the scale's own
    override (`geometry.tiny.target.hidden_size`) or the base it inherits (`geometry.target...`)."""

    def __init__(self, r: _Reader, scale: str):
        self.r, self.scale = r, scale
        self.overrides = r.data["geometry"].get(scale, {}) if scale != FULL else {}

    def key(self, role: str, name: str) -> str:
        if name in (self.overrides.get(role) or {}):
            return f"geometry.{self.scale}.{role}.{name}"
        return f"geometry.{role}.{name}"

    def value(self, role: str, name: str, kind: Any) -> Any:
        dotted = self.key(role, name)
        if kind is int:
            v = self.r.get(dotted, int)
            if v <= 0:
                raise self.r.fail(dotted, "a positive integer", v)
        elif kind is float:
            v = self.r.get(dotted, float)
            if v <= 0:
                raise self.r.fail(dotted, "a positive number", v)
        else:  # tuple[int, ...]: layer ids, rope sections
            v = self.r.get(dotted, list)
            if not v or not all(map(is_index, v)):
                raise self.r.fail(dotted, "a list of integers >= 0", v)
            v = tuple(v)
        return v

    def build(self) -> Geometry:
        parts = {role: cls(**{name: self.value(role, name, kind) for name, kind in get_type_hints(cls).items()})
                 for role, cls in _ROLES.items()}
        geo = Geometry(parts["target"], parts["drafter"])
        problems = _geometry_problems(geo, self.key)
        if problems:
            at = f" (scale {self.scale})" if self.scale != FULL else ""
            raise RecipeError(f"{self.r.source}: " + "; ".join(problems) + at,
                              "the geometry's rules are described in recipes/README.md")
        return geo


def _geometry_problems(g: Geometry, key: Any) -> list[str]:
    """What llama.cpp (and `buun synth`'s vocabulary) need across fields, each named by its key."""
    t, d = g.target, g.drafter
    rules = (
        ("drafter", "hidden_size", d.hidden_size, d.hidden_size == t.hidden_size,
         f"{key('target', 'hidden_size')} ({t.hidden_size}): llama.cpp feeds the target's hidden states "
         "to the drafter's fc"),
        ("target", "linear_value_head_dim", t.linear_value_head_dim, t.linear_value_head_dim == t.linear_key_head_dim,
         f"{key('target', 'linear_key_head_dim')} ({t.linear_key_head_dim}): qwen35 has one ssm.state_size"),
        ("target", "linear_num_value_heads", t.linear_num_value_heads,
         t.linear_num_value_heads % t.linear_num_key_heads == 0,
         f"a multiple of {key('target', 'linear_num_key_heads')} ({t.linear_num_key_heads})"),
        ("target", "mrope_section", list(t.mrope_section), 2 * sum(t.mrope_section) == t.n_rot,
         f"sections summing to head_dim * partial_rotary_factor / 2 ({t.n_rot / 2:g})"),
        ("drafter", "target_layer_ids", list(d.target_layer_ids), max(d.target_layer_ids) + 1 < t.num_hidden_layers,
         f"layer indices in [0, {t.num_hidden_layers - 1}): the drafter reads layer inputs, so the last of "
         f"{key('target', 'num_hidden_layers')} ({t.num_hidden_layers}) is left out"),
        ("drafter", "mask_token_id", d.mask_token_id,
         t.eos_token_id + len(SPECIAL_TOKENS) <= d.mask_token_id < t.vocab_size,
         f"an id in [{t.eos_token_id + len(SPECIAL_TOKENS)}, {t.vocab_size}): after the target's "
         f"{len(SPECIAL_TOKENS)} special tokens from {key('target', 'eos_token_id')} and inside "
         f"{key('target', 'vocab_size')}"),
    )
    return [f"{key(role, name)}: expected {expected}, got {got!r}" for role, name, got, ok, expected in rules if not ok]


def _validate_geometry(r: _Reader) -> dict[str, Geometry]:
    """Every scale typed and checked: the base (`full`) and each shrink written under geometry."""
    r.get("geometry", dict)
    scales = [FULL, *(k for k in r.data["geometry"] if k not in _ROLES)]
    return {scale: _GeometryReader(r, scale).build() for scale in scales}


def _tree(r: _Reader) -> tuple[int, int]:
    """server.tree's budget (0 or more; 0 and 1 are the chain) and K (1 or more)."""
    budget = r.get("server.tree.budget", int, 0)
    if budget < 0:
        raise r.fail("server.tree.budget", "0 (the chain) or a number of draft nodes", budget)
    k = r.get("server.tree.k", int, 8)
    if k < 1:
        raise r.fail("server.tree.k", "a positive number of candidates per draft depth", k)
    return budget, k


def _slots(r: _Reader) -> int:
    """server.slots: 1 to MAX_SLOTS requests at once."""
    n = r.get("server.slots", int, 1)
    if not 1 <= n <= MAX_SLOTS:
        raise r.fail("server.slots", f"a number of slots from 1 to {MAX_SLOTS}", n)
    return n


def _gpus(r: _Reader) -> tuple[int, ...]:
    """server.gpus: nvidia-smi indices, each once (`buun serve --gpus` checks them against the cards)."""
    items = r.get("server.gpus", list, [])
    if not all(map(is_index, items)):
        raise r.fail("server.gpus", "a list of nvidia-smi card indices, such as [0, 1]", items)
    if len(set(items)) != len(items):
        raise r.fail("server.gpus", "each card once", items)
    return tuple(items)


def parse(source: Path, data: Any) -> Recipe:
    r = _Reader(source, data)
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
        geometry=_validate_geometry(r),
        server_flags=dict(flags),
        tree_budget=tree_budget,
        tree_k=tree_k,
        slots=_slots(r),
        gpus=_gpus(r),
    )


def load_yaml(text: str, source: Path, error: type[UsageError] = RecipeError) -> Any:
    """The YAML document in `text` (read from `source`), as yaml.safe_load gives it, but a key given
    twice in one mapping is an `error` naming both lines: PyYAML keeps the last and drops the first
    without a word (a recipe's second `server:` took every flag of the first, DFlash with them).
    Every YAML file buun reads from the user goes through here."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_repeated_keys(loader, node, source, error)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _refuse_repeated_keys(loader: yaml.SafeLoader, root: yaml.Node, source: Path,
                          error: type[UsageError]) -> None:
    seen: set[int] = set()  # a node an alias repeats is checked once (`&a` ten times over is 10**9 nodes)
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, where = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = loader.construct_object(key_node)  # typed: `yes` and `true` are one key
                    dotted = f"{where}.{key}" if where else str(key)
                    line = key_node.start_mark.line + 1
                    if key in lines:
                        raise error(f"{source}: {dotted} is given twice, at lines {lines[key]} and {line}: "
                                    "YAML would keep the second and drop the first without a word",
                                    f"keep one `{key}:` in that place and put everything under it")
                    lines[key] = line
                else:
                    dotted = where
                todo.append((value_node, dotted))


def load_file(path: Path) -> Recipe:
    try:
        data = load_yaml(path.read_bytes().decode("utf-8"), path)  # UTF-8 whatever the locale
    except FileNotFoundError:
        raise RecipeError(f"recipe file {path} does not exist",
                          "run `buun recipes` to list the known recipes") from None
    except UnicodeDecodeError as exc:  # another encoding: not a traceback
        raise RecipeError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                          "save the recipe as UTF-8 and run the same command again") from None
    if data is None:  # an empty file (or only comments): not "a mapping ... got NoneType"
        raise RecipeError(f"{path}: the file is empty", "a recipe is a YAML mapping, as recipes/*.yaml are")
    return parse(path, data)


def available() -> dict[str, Path]:
    """Recipes shipped in recipes/ and the user's own in the config dir (theirs win)."""
    found: dict[str, Path] = {}
    for d in (paths.recipes_dir(), paths.config_dir() / "recipes"):
        if d.is_dir():
            for f in sorted(d.glob("*.yaml")):
                found[f.stem] = f
    return found


def reference(source: Path) -> str:
    """How a command names the recipe read from `source`: its name where `buun` finds that file by
    the name (recipes/, the config folder's), else the path as the user gave it, quoted for a shell.
    A recipe file's own `name` may be a shipped recipe's: `buun pull NAME` would pull that one."""
    known = available().get(source.stem)
    if known is not None and known.resolve() == source.resolve():
        return source.stem
    return shlex.quote(str(source))


def load(name_or_path: str | None = None) -> Recipe:
    """A recipe by name (see `buun recipes`) or by path to a YAML file. A known name is that recipe
    even where the current folder holds a file of the same name (a cloned repository, an unpacked
    download): such a file must not replace the recipe `buun setup` runs by default, its Hub repos
    and server flags. `./NAME` loads the file."""
    ref = name_or_path or DEFAULT_RECIPE
    known = available()
    if ref in known:
        return load_file(known[ref])
    as_path = Path(ref).expanduser()
    if as_path.is_dir():  # not "unknown recipe": the user gave a path, to the wrong thing
        raise RecipeError(f"{ref} is a folder, not a recipe file",
                          f"pass the recipe's YAML file in it, or a name `buun recipes` lists "
                          f"({', '.join(sorted(known)) or 'none'})")
    if ref.endswith((".yaml", ".yml")) or as_path.is_file():
        return load_file(as_path)
    raise RecipeError(f"unknown recipe '{ref}'", f"known recipes: {', '.join(sorted(known)) or 'none'}; "
                      "or pass the path of a recipe file")
