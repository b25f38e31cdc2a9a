"""The convert stage's records and its own answer from them. Each GGUF it makes gets a provenance
record (`<gguf>.provenance.json`): the inputs it was made from (convert_inputs.py) and the file's
size and sha256, no timestamps or paths, so equal inputs give an equal record. The stage is current
when the final GGUF is the file its record describes and the record's inputs are today's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buun_tool.base.errors import BuunError
from buun_tool.base.fsutil import sha256_file
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import drafter
from buun_tool.pipeline.convert_env import env_is_current
from buun_tool.pipeline.convert_inputs import expected_inputs
from buun_tool.pipeline.stage import StageStatus, current, stale

# The provenance records' format. 2: the sources' hashes are of the bytes the converter read (1
# copied the manifest's, even of a file changed since), so a version 1 GGUF is made again.
PROVENANCE = 2


def provenance_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".provenance.json")


def _intact(gguf: Path) -> tuple[dict[str, Any] | None, str]:
    """The provenance record of `gguf` when it is of this format and the file is the one it
    describes; else None and why not."""
    try:
        record = json.loads(provenance_path(gguf).read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None, f"{gguf.name} is not made yet (no provenance record)"
    # a record damaged or written by hand into another JSON shape vouches for nothing: made again
    if not (isinstance(record, dict) and isinstance(record.get("output"), dict)
            and isinstance(record.get("inputs"), dict)):
        return None, f"{gguf.name} has a provenance record buun cannot read ({provenance_path(gguf).name})"
    if record.get("buun_provenance") != PROVENANCE:
        return None, (f"{gguf.name} was made by an older buun (provenance format "
                      f"{record.get('buun_provenance')}, now {PROVENANCE})")
    out = record.get("output") or {}
    if not gguf.is_file() or gguf.stat().st_size != out.get("size") or sha256_file(gguf) != out.get("sha256"):
        return None, f"{gguf.name} is not the file its provenance record describes"
    return record, ""


def made_from(gguf: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The provenance record of `gguf` when the file is intact and was made from `inputs`."""
    record, _ = _intact(gguf)
    return record if record is not None and record.get("inputs") == inputs else None


def make_record(gguf: Path, kind: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A provenance record. No timestamps or paths: equal inputs give an equal record."""
    return {"buun_provenance": PROVENANCE,
            "output": {"file": gguf.name, "size": gguf.stat().st_size, "sha256": sha256_file(gguf), "type": kind},
            **extra, "inputs": inputs}


# --- the stage's own answer: the GGUF's provenance against the inputs as they are now --------

# why a recorded input that differs from today's makes the GGUF stale
_STALE_BECAUSE = {
    "sources": "the drafter or tokenizer files are not the ones it was made from",
    "llama_cpp": "the vendored llama.cpp (its converter or gguf-py) changed since",
    "converter_env": "the converter's environment changed since",
    "outtype": "the intermediate type changed",
    "quantize": "llama-quantize was rebuilt since (its build stamp changed)",
    "quant": "the recipe asks for another quant type",
}


def judge(recipe: Recipe, models_dir: Path, facts: dict[str, Any]) -> tuple[StageStatus, dict[str, Any] | None]:
    """The stage's status and, when current, the final GGUF's provenance record."""
    final = layout.for_recipe(recipe, models_dir).drafter_gguf()
    record, why = _intact(final)
    if record is None:
        return stale(why), None
    try:
        want = expected_inputs(recipe, models_dir, facts)
    except BuunError as exc:  # a source changed on disk, no llama-quantize: the conversion says what to do
        return stale(exc.message), None
    got = record.get("inputs") or {}
    changed = [k for k in want if got.get(k) != want[k]]
    if not env_is_current(got.get("converter_env")):
        changed.append("converter_env")
    if changed:
        return stale("; ".join(_STALE_BECAUSE[k] for k in changed)), None
    return current(f"{final.name}, made from the pulled sources with this llama.cpp and llama-quantize"), record


def stage_status(recipe: Recipe, models_dir: Path) -> StageStatus:
    """The convert stage's own answer, from the final GGUF's provenance record: what `buun convert`
    acts on and `buun setup` plans by."""
    try:
        facts = drafter.check_folder(recipe, models_dir)
    except BuunError as exc:
        return stale(exc.message)
    return judge(recipe, models_dir, facts)[0]
