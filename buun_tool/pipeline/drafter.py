"""Stage: make the drafter folder complete, as the buun fork's guide has users do by hand.

The z-lab drafter repos ship a config.json and weights but no tokenizer. This stage copies the
target's tokenizer files from the tokenizer folder into the drafter folder, checks that every
file the converter reads is there, and checks the two configs against each other (hidden
sizes, tapped layers, mask token) so a mismatched pair fails here with a clear message instead
of deep inside the converter. It never overwrites the drafter's own config.json or weights:
the target's config.json stays in the tokenizer folder, which is what `--target-model-dir`
points the converter at.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import re
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from buun_tool.base import console, locks
from buun_tool.base.errors import BuunError, NotReadyError, UsageError
from buun_tool.base.fsutil import clear_leftovers, replaced
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe, is_index, shown
from buun_tool.pipeline.pull import MANIFEST, require_pulled
from buun_tool.pipeline.stage import StageStatus, current, stale

DRAFTER_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
SAFETENSORS_MAX_HEADER = 100_000_000  # the format's limit on its JSON header (the safetensors library's)


@dataclass
class DrafterFolder:
    folder: str
    tokenizer_folder: str
    copied: list[str]
    already_there: list[str]
    facts: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config keeps the language model's settings under text_config."""
    return {**cfg, **(cfg.get("text_config") or {})}


_JSON_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def _found(value: Any) -> str:
    text = json.dumps(value)  # JSON's spelling (true, null), not Python's
    return f"{_JSON_KINDS.get(type(value), type(value).__name__)} ({text[:60]}{'...' if len(text) > 60 else ''})"


def config_problems(cfg: dict[str, Any], path: Path, *, objects: tuple[str, ...], lists: tuple[str, ...],
                    counts: tuple[str, ...], required: tuple[str, ...], indices: tuple[str, ...] = ()) -> list[str]:
    """What in a config.json has a type nothing downstream can use: `objects` must be objects,
    `lists` lists, `counts` positive integers, `indices` non-negative integers (or, for a field
    also in `lists`, lists of them); `required` counts must be there. A missing optional field
    (or null) is fine. Field names may be dotted (dflash_config.block_size)."""
    def get(name: str) -> Any:
        head, _, rest = name.partition(".")
        value = cfg.get(head)
        return value.get(rest) if rest and isinstance(value, dict) else None if rest else value

    problems = []
    for name in objects:
        if get(name) is not None and not isinstance(get(name), dict):
            problems.append(f"{path}: {name} must be an object, found {_found(get(name))}")
    for name in lists:
        if get(name) is not None and not isinstance(get(name), list):
            problems.append(f"{path}: {name} must be a list, found {_found(get(name))}")
    for name in counts:
        value = get(name)
        if value is None:
            if name in required:
                problems.append(f"{path}: {name} is missing (a positive integer)")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{path}: {name} must be a positive integer, found {_found(value)}")
    for name in indices:
        value = get(name)
        if name in lists:  # a list's own type is named above
            bad = [v for v in value if not is_index(v)] if isinstance(value, list) else []
            want = "a list of non-negative integers"
        else:
            bad = [] if value is None or is_index(value) else [value]
            want = "a non-negative integer"
        if bad:
            problems.append(f"{path}: {name} must be {want}, found {_found(bad[0])}")
    return problems


def check_config_types(drafter_cfg: dict[str, Any], target_cfg: dict[str, Any], drafter_cfg_path: Path,
                       target_cfg_path: Path) -> None:
    """Every field `drafter_facts` reads has a type it can use, before it reads one: a config
    from the Hub is anyone's. Every problem at once, each with its file and field."""
    problems = config_problems(
        drafter_cfg, drafter_cfg_path, objects=("dflash_config",),
        lists=("architectures", "target_layer_ids", "dflash_config.target_layer_ids"),
        counts=("hidden_size", "num_hidden_layers", "head_dim", "num_attention_heads", "block_size",
                "dflash_config.block_size"),
        required=("hidden_size", "num_hidden_layers"),
        indices=("target_layer_ids", "dflash_config.target_layer_ids", "dflash_config.mask_token_id"))
    text = target_cfg.get("text_config")

    def where(*names: str) -> tuple[str, ...]:  # text_config's settings win over the top level's
        return tuple(f"text_config.{n}" if isinstance(text, dict) and n in text else n for n in names)

    counts = where("hidden_size", "num_hidden_layers", "vocab_size")
    problems += config_problems(target_cfg, target_cfg_path, objects=("text_config", *where("rope_parameters",
                                "rope_scaling")), lists=(), counts=counts, required=counts)
    if problems:
        raise UsageError("a config.json has fields buun cannot use:\n  " + "\n  ".join(problems),
                         "these files come from the recipe's drafter and tokenizer repos: check their repos and "
                         "revisions (a target's settings may sit under text_config)")


def read_config(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuunError(f"{what} {path} is missing", "run `buun pull` again") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a too long integer
        raise BuunError(f"{what} {path} is not valid JSON: {_json_error(exc)}",
                        "delete it and run `buun pull` again") from None
    if not isinstance(data, dict):
        raise BuunError(f"{what} {path} is not a JSON object")
    return data


def _json_error(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    digits = re.search(r"value has (\d+) digits", str(exc))
    if digits and not isinstance(exc, json.JSONDecodeError):  # Python reads integers of 4300 digits at most
        return f"an integer of {digits.group(1)} digits, longer than any a model's file has"
    return str(exc)


# What is wrong with each JSON content checked so far, by its sha256 (None: it parses). `buun setup`
# checks the drafter folder in the drafter stage and again before converting (each stage checks
# its own inputs: either runs alone); the same bytes are parsed once (Qwen's 16 MB tokenizer.json:
# half a second; its sha256: 10 ms). Keyed by the bytes, not the path or the mtime: a file changed
# in between is judged anew.
_JSON_VERDICTS: dict[bytes, str | None] = {}


def _json_problem(path: Path) -> str | None:
    raw = path.read_bytes()
    key = hashlib.sha256(raw).digest()
    if key not in _JSON_VERDICTS:
        try:
            json.loads(raw)
            _JSON_VERDICTS[key] = None
        except (ValueError, RecursionError) as exc:
            _JSON_VERDICTS[key] = _json_error(exc)
    error = _JSON_VERDICTS[key]
    return f"{path} is not valid JSON: {error}" if error else None


def _safetensors_problem(path: Path) -> str | None:
    """What makes a .safetensors unreadable, from its header alone: its length, the JSON after it,
    every tensor's data inside the file."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{path} is {size} bytes: too short for a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > SAFETENSORS_MAX_HEADER:  # read whole into memory below: the file's word is not enough
            return (f"{path}: its header claims {n} bytes, more than the {SAFETENSORS_MAX_HEADER} "
                    "a safetensors file may have")
        if 8 + n > size:
            return f"{path}: its header claims {n} bytes, the file has {size - 8} after the length"
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return f"{path}: its header is not valid JSON: {_json_error(exc)}"
    if not isinstance(header, dict):
        return f"{path}: its header is not a JSON object"
    data = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_index(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data):
            return f"{path}: tensor {name} has data_offsets {offsets!r} outside the file's {data} data bytes"
    return None


def check_readable(recipe: Recipe, models_dir: Path) -> None:
    """The drafter folder's JSON files parse and its safetensors headers are whole: a broken file
    (from a repo, or changed on disk) is named here, before the converter's environment is made,
    not in the converter's traceback. Every problem at once."""
    folder = layout.for_recipe(recipe, models_dir).drafter_dir
    problems = []
    for name in dict.fromkeys((*recipe.drafter.files, *recipe.tokenizer.files)):
        path = folder / name
        problem = (_json_problem(path) if name.endswith(".json")
                   else _safetensors_problem(path) if name.endswith(".safetensors") else None)
        if problem:
            problems.append(problem)
    if problems:
        raise UsageError("the drafter folder has files the converter cannot read:\n  " + "\n  ".join(problems),
                         f"`buun pull --verify {recipe.ref}` downloads a file that changed on disk again (then "
                         f"`buun drafter {recipe.ref}`); if the repo's own file is broken, pick another revision "
                         "in the recipe")


def drafter_facts(drafter_cfg: dict[str, Any], target_cfg: dict[str, Any]) -> dict[str, Any]:
    """What the converted GGUF must say, read from the two configs."""
    dflash = drafter_cfg.get("dflash_config") or {}
    target = text_config(target_cfg)
    rope = target.get("rope_parameters") or target.get("rope_scaling") or {}
    return {
        "architecture": (drafter_cfg.get("architectures") or [None])[0],
        "hidden_size": drafter_cfg.get("hidden_size"),
        "num_hidden_layers": drafter_cfg.get("num_hidden_layers"),
        "head_dim": drafter_cfg.get("head_dim")
        or (drafter_cfg.get("hidden_size") or 0) // max(1, drafter_cfg.get("num_attention_heads") or 1),
        "block_size": dflash.get("block_size", drafter_cfg.get("block_size", 16)),
        "mask_token_id": dflash.get("mask_token_id"),
        "target_layer_ids": list(dflash.get("target_layer_ids") or drafter_cfg.get("target_layer_ids") or []),
        "target_hidden_size": target.get("hidden_size"),
        "target_num_layers": target.get("num_hidden_layers"),
        "target_vocab_size": target.get("vocab_size"),
        "target_mrope": "mrope_section" in rope,
        "dtype": drafter_cfg.get("dtype") or drafter_cfg.get("torch_dtype"),
        "selector_top_k": dflash.get("selector_top_k") or 0,  # a DFlash2 drafter's selector
    }


def check_pair(facts: dict[str, Any], recipe: Recipe, drafter_cfg_path: Path, target_cfg_path: Path) -> None:
    """The drafter must fit the target (and the recipe's expectations); every problem at once."""
    problems = []
    if facts["architecture"] not in DRAFTER_ARCHITECTURES:
        problems.append(f"{drafter_cfg_path}: architectures[0] is {facts['architecture']!r}, "
                        f"not a DFlash drafter ({', '.join(DRAFTER_ARCHITECTURES)})")
    if facts["hidden_size"] != facts["target_hidden_size"]:
        problems.append(f"hidden sizes differ: drafter {facts['hidden_size']} ({drafter_cfg_path}), "
                        f"target {facts['target_hidden_size']} ({target_cfg_path})")
    n_target = facts["target_num_layers"] or 0
    ids = facts["target_layer_ids"]
    if not ids or not all(is_index(i) and i < n_target for i in ids):
        problems.append(f"dflash_config.target_layer_ids {ids} are not layers of the {n_target}-layer target")
    vocab = facts["target_vocab_size"] or 0
    if not is_index(facts["mask_token_id"]) or not facts["mask_token_id"] < vocab:
        problems.append(f"dflash_config.mask_token_id {facts['mask_token_id']!r} is not a token of the "
                        f"{vocab}-token vocabulary")
    expect = recipe.expect
    for key, got in (("block_size", facts["block_size"]), ("mask_token_id", facts["mask_token_id"]),
                     ("target_layer_ids", ids), ("hidden_size", facts["hidden_size"])):
        if key in expect and expect[key] != got:
            problems.append(f"{recipe.source}: expect.{key} is {shown(expect[key])} but the drafter has {got!r}")
    if problems:
        raise UsageError("the drafter does not fit the target:\n  " + "\n  ".join(problems),
                         "check the recipe's drafter/tokenizer repos and revisions")


def _copy_if_changed(src: Path, dst: Path) -> bool:
    """Copy through a temporary name (a reader never sees half a file); False when equal."""
    if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
        return False
    with replaced(dst) as tmp:  # a full disk or a Ctrl-C leaves no half copy behind
        shutil.copyfile(src, tmp)
    return True


def tokenizer_files(recipe: Recipe) -> tuple[str, ...]:
    """The files to copy; refuses any that would replace the drafter's own config or weights."""
    own = set(recipe.drafter.files)
    bad = [f for f in recipe.tokenizer.files
           if f in own or f == "config.json" or f.endswith(WEIGHT_SUFFIXES)]
    if bad:
        raise UsageError(f"{recipe.source}: tokenizer.files lists {', '.join(bad)}, which would overwrite the "
                         "drafter's own config or weights",
                         "list only tokenizer files there; the target's config goes in tokenizer.target_config")
    return recipe.tokenizer.files


def stage_status(recipe: Recipe, models_dir: Path) -> StageStatus:
    """The drafter stage's own answer: current when `prepare` has nothing to do, the folder
    complete and every copy equal to its source."""
    try:
        check_folder(recipe, models_dir)
    except BuunError as exc:
        return stale(exc.message)
    lay = layout.for_recipe(recipe, models_dir)
    differ = [n for n in tokenizer_files(recipe)
              if not filecmp.cmp(lay.tokenizer_dir / n, lay.drafter_dir / n, shallow=False)]
    if differ:
        return stale(f"the drafter folder's copies differ from the tokenizer's: {', '.join(differ)}")
    return current(f"{lay.drafter_dir} is complete")


def prepare(recipe: Recipe, models_dir: Path) -> DrafterFolder:
    """Copy the tokenizer files into the drafter folder and check the folder is complete."""
    # not while a pull replaces the files copied or checked; a folder this process cannot write
    # still answers when the drafter folder is ready
    with locks.models_folder(models_dir, unwritable_ok=True) as unwritable:
        if unwritable is not None:
            return _ready(recipe, models_dir, unwritable)
        return _prepare(recipe, models_dir)


def _ready(recipe: Recipe, models_dir: Path, unwritable: OSError) -> DrafterFolder:
    """`buun drafter` in a models folder this process cannot write (a read-only mount, another
    user's folder): the folder when it is ready, as `buun drafter` says it; else why nothing is done."""
    status = stage_status(recipe, models_dir)
    if not status.current:
        raise UsageError(f"the drafter folder is to be completed ({status.detail}), but {models_dir} cannot be "
                         f"written: {unwritable.strerror} ({unwritable.filename})",
                         "make the models folder writable, or give a writable one (--models-dir, BUUN_MODELS_DIR), "
                         "then run the same command again")
    lay = layout.for_recipe(recipe, models_dir)
    facts = check_folder(recipe, models_dir)
    check_readable(recipe, models_dir)
    console.ok(f"drafter folder ready: {lay.drafter_dir} (tokenizer files already there)")
    return DrafterFolder(str(lay.drafter_dir), str(lay.tokenizer_dir), [], list(tokenizer_files(recipe)), facts)


def _prepare(recipe: Recipe, models_dir: Path) -> DrafterFolder:
    names = tokenizer_files(recipe)
    drafter_dir, _ = require_pulled(recipe, "drafter", models_dir)
    tok_dir, _ = require_pulled(recipe, "tokenizer", models_dir)
    copied, same = [], []
    for name in names:
        clear_leftovers(drafter_dir, "tmp", name)  # a killed run's half copy, also of a file not copied again
        (copied if _copy_if_changed(tok_dir / name, drafter_dir / name) else same).append(name)
    facts = check_folder(recipe, models_dir)
    check_readable(recipe, models_dir)
    console.ok(f"drafter folder ready: {drafter_dir}"
               + (f" (copied {', '.join(copied)})" if copied else " (tokenizer files already there)"))
    return DrafterFolder(str(drafter_dir), str(tok_dir), copied, same, facts)


def stray_files(recipe: Recipe, models_dir: Path) -> list[Path]:
    """What the drafter and tokenizer folders hold besides the recipe's files and buun's own (its
    manifest; hidden names: partial downloads, copies being written). The converter would read
    such a file (a shard and its index, a chat template) without the provenance record naming it."""
    lay = layout.for_recipe(recipe, models_dir)
    named = {lay.drafter_dir: (*recipe.drafter.files, *recipe.tokenizer.files),
             lay.tokenizer_dir: recipe.repos()["tokenizer"].files}
    stray = []
    for folder, names in named.items():
        known = {name.split("/")[0] for name in names} | {MANIFEST}
        if folder.is_dir():
            stray += sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.name not in known)
    return stray


def check_folder(recipe: Recipe, models_dir: Path) -> dict[str, Any]:
    """For `convert`: every file present, none the recipe does not name, and the pair consistent;
    returns the drafter facts."""
    lay = layout.for_recipe(recipe, models_dir)
    need = [lay.drafter_dir / f for f in (*recipe.drafter.files, *recipe.tokenizer.files)]
    need.append(lay.tokenizer_dir / recipe.target_config)
    need += [lay.tokenizer_dir / f for f in recipe.tokenizer.files]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise NotReadyError("the drafter folder is incomplete, missing:\n  " + "\n  ".join(missing),
                            f"run `buun pull {recipe.ref}` and `buun drafter {recipe.ref}`")
    stray = stray_files(recipe, models_dir)
    if stray:
        raise UsageError("the model folders hold files the recipe does not name:\n  " + "\n  ".join(map(str, stray))
                         + "\nthe converter reads what a folder holds, not the recipe's list (every "
                         "model*.safetensors, the shards a model.safetensors.index.json names, chat templates, added "
                         "tokens): the GGUF would be made from files nothing checked",
                         "move them out of these folders (`buun pull` puts only the recipe's files there); to "
                         f"convert with them, name them in {recipe.source} (drafter.files or tokenizer.files) and "
                         f"run `buun pull {recipe.ref}`")
    drafter_cfg_path = lay.drafter_dir / "config.json"
    target_cfg_path = lay.tokenizer_dir / recipe.target_config
    drafter_cfg = read_config(drafter_cfg_path, "the drafter config")
    target_cfg = read_config(target_cfg_path, "the target config")
    check_config_types(drafter_cfg, target_cfg, drafter_cfg_path, target_cfg_path)
    facts = drafter_facts(drafter_cfg, target_cfg)
    check_pair(facts, recipe, drafter_cfg_path, target_cfg_path)
    return facts
