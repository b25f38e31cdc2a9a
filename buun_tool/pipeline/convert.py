"""Stage: convert the drafter to GGUF, quantize it, verify it and record where it came from.

1. The vendored `convert_hf_to_gguf.py` (with the vendored gguf-py) turns the drafter folder
   into a BF16 GGUF (F16 when the checkpoint is not BF16), given `--target-model-dir` = the
   tokenizer folder: upstream takes the vocabulary and the target's M-RoPE layout from there.
2. The built `llama-quantize` makes the recipe's quant (Q4_K_M).
3. The result is read back (gguf_tools' reader, gguf-py's format constants) and checked
   against the two configs: architecture, block size, mask token, tapped layers (+1), hidden
   size, vocabulary size, M-RoPE sections, the exact tensor set and the quant type.
4. Each GGUF gets a provenance record (`<gguf>.provenance.json`): source revisions and the
   sha256 of the bytes the converter read (a source that changed since `buun pull` verified it
   is refused, and so is a GGUF whose sources changed while the converter read them, or whose
   folders hold files the recipe does not name), the llama.cpp pin and applied patches, the
   converter's environment, llama-quantize's build, and what verification read.

Every file is written under a temporary name and renamed into place only when complete and
verified: a failure keeps the previous good GGUF (a full disk is exit 7, whatever the converter or
llama-quantize printed). Unchanged inputs make the stage a no-op, a current intermediate is reused
when only the quant changes, and the same inputs always give the same bytes.

The parts: the converter's environment (convert_env.py), the inputs a record names
(convert_inputs.py), verification (convert_verify.py), the records and the stage's status from
them (convert_record.py); this module runs the converter and llama-quantize in order. Their names
are convert's too: callers say convert.stage_status, convert.provenance_path.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from buun_tool.base import console, locks, paths
from buun_tool.base.errors import DISK_FULL, BuunError, CommandError, Exit, NotReadyError, UsageError, disk_full
from buun_tool.base.fsutil import clear_leftovers, open_private, private_dir, replaced, write_json_atomic
from buun_tool.base.proc import run_logged
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import build, drafter, vendor
from buun_tool.pipeline.convert_env import CONVERTER_REQUIREMENTS, ENV_STAMP, converter_env_dir, converter_python
from buun_tool.pipeline.convert_inputs import (
    check_sources_kept,
    conversion_inputs,
    file_stats,
    inputs_of,
    intermediate_type,
    read_by_converter,
)
from buun_tool.pipeline.convert_record import PROVENANCE, judge, made_from, make_record, provenance_path, stage_status
from buun_tool.pipeline.convert_verify import FLOAT_TYPES, expected_tensors, verify
from buun_tool.pipeline.pull import DISK_RESERVE, disk_hint
from buun_tool.pipeline.stage import stale

__all__ = [
    # convert_env.py, convert_inputs.py, convert_record.py, convert_verify.py
    "CONVERTER_REQUIREMENTS", "ENV_STAMP", "converter_env_dir", "converter_python", "conversion_inputs", "inputs_of",
    "intermediate_type", "PROVENANCE", "provenance_path", "stage_status", "FLOAT_TYPES", "expected_tensors", "verify",
    # the stage's own
    "space_needed", "check_disk", "run_converter", "run_quantize", "PROBE_BYTES", "ConvertResult", "convert",
    "require_converted",
]


# --- small helpers --------------------------------------------------------------------------

def space_needed(lay: layout.Layout, recipe: Recipe) -> int:
    """Room for the intermediate (about the checkpoint's size) and the quantized file."""
    weights = sum((lay.drafter_dir / f).stat().st_size for f in recipe.drafter.files)
    return weights * (1 if recipe.quantize in FLOAT_TYPES else 2) + DISK_RESERVE


def check_disk(lay: layout.Layout, recipe: Recipe) -> None:
    need = space_needed(lay, recipe)
    where = lay.gguf_dir if lay.gguf_dir.exists() else lay.root
    free = shutil.disk_usage(where).free
    if free < need:
        raise BuunError(f"not enough disk space in {where} to convert: about {need / 2**30:.1f} GiB needed, "
                        f"{free / 2**30:.1f} GiB free", disk_hint(lay.root, need, free), Exit.DISK)


def _log_path(recipe: Recipe) -> Path:
    return paths.state_dir() / "logs" / f"convert-{recipe.name}.log"


# --- converting and quantizing --------------------------------------------------------------

def run_converter(python: Path, model_dir: Path, target_dir: Path | None, out: Path, outtype: str, log: Path,
                  extra: tuple[str, ...] = ()) -> None:
    """The vendored converter, with the vendored gguf-py, offline (all inputs are local)."""
    llama = vendor.require_vendored()
    env = {"PYTHONPATH": str(llama / "gguf-py"), "PYTHONDONTWRITEBYTECODE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [python, llama / "convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype.lower()]
    if target_dir is not None:
        cmd += ["--target-model-dir", target_dir]
    run_logged([*cmd, *extra], log, env=env, what="the GGUF converter",
               hint="the last lines above say why; the log has the rest")


def run_quantize(src: Path, out: Path, quant: str, log: Path) -> None:
    quantize = build.find_binary("llama-quantize")
    run_logged([quantize, src, out, quant], log, what="llama-quantize", hint="see the log")


# --- a full disk under the converter or llama-quantize -----------------------------------------

PROBE_BYTES = 1 << 20


class _NoRoom(Exception):
    """A child that failed writing `final` (under its temporary name) on a full disk, or past a
    quota or `ulimit -f`."""

    def __init__(self, error: OSError, what: str, final: Path):
        super().__init__(error.strerror)
        self.error, self.what, self.final = error, what, final


def _no_room(out: Path) -> OSError | None:
    """The error the disk of `out` gives a write now, when it is that of a full disk (None when a
    write goes through). A child that ran out of room says so in its own words (the converter a
    Python traceback, llama-quantize `iostream error`, or it dies of SIGXFSZ past `ulimit -f`),
    none to rely on: one MiB more appended to its half-written output (removed with it) meets the
    same full disk, quota or file-size limit."""
    try:
        with open(out, "ab") as f:
            f.write(bytes(PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc if exc.errno in DISK_FULL else None
    return None


def _writing(tmp: Path, final: Path, what: str, child: Callable[[], None]) -> None:
    """Run `child`, which writes `final` under its temporary name `tmp`; its failure on a full disk
    is _NoRoom, whatever it printed."""
    try:
        child()
    except CommandError:
        full = _no_room(tmp)
        if full is None:
            raise
        raise _NoRoom(full, what, final) from None


def _disk_full(exc: _NoRoom, lay: layout.Layout, recipe: Recipe, log: Path) -> BuunError:
    """pull's message for a full disk: where, how much is needed and free, what to delete. Made
    once the half-written file is gone, so the free space is what the user has."""
    if exc.error.errno == errno.EFBIG:
        return disk_full(exc.error, f"write {exc.final} ({exc.what})")
    need = space_needed(lay, recipe)
    free = shutil.disk_usage(lay.gguf_dir).free
    return BuunError(f"the disk is full: {exc.what} could not write {exc.final} "
                     f"({exc.error.strerror or 'no space left on device'}); converting needs about {_amount(need)} "
                     f"free in {lay.gguf_dir}, {_amount(free)} is free",
                     f"{disk_hint(lay.root, need, free)}; then run the same command again: the previous GGUF is "
                     f"kept (the {exc.what}'s own output is in {log})", Exit.DISK)


# --- the stage ------------------------------------------------------------------------------

@dataclass
class ConvertResult:
    gguf: str
    intermediate: str | None
    provenance: str
    rebuilt: bool
    seconds: float
    verified: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _convert_to(lay: layout.Layout, python: Path, final: Path, outtype: str, log: Path, kept: Callable[[], None],
                facts: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Run the converter into a temporary name; check that its sources stayed as hashed (`kept`);
    verify it when `facts` are given (the file is the final one); rename it into place only then."""
    with replaced(final, "partial") as tmp:
        _writing(tmp, final, "the GGUF converter",
                 lambda: run_converter(python, lay.drafter_dir, lay.tokenizer_dir, tmp, outtype, log))
        kept()
        if not tmp.is_file():
            raise BuunError(f"the converter finished but wrote no {tmp}", f"see {log}")
        report = verify(tmp, facts, outtype) if facts is not None else None
    return report


def _quantize_to(src: Path, final: Path, quant: str, facts: dict[str, Any], log: Path) -> dict[str, Any]:
    with replaced(final, "partial") as tmp:
        _writing(tmp, final, "llama-quantize", lambda: run_quantize(src, tmp, quant, log))
        report = verify(tmp, facts, quant)
    return report


def _produce(lay: layout.Layout, recipe: Recipe, facts: dict[str, Any], python: Path, inputs: dict[str, Any],
             log: Path, force: bool, kept: Callable[[], None]) -> tuple[dict[str, Any], Path | None]:
    """The GGUF(s): (verification report, intermediate file or None). A current intermediate
    (same sources, converter and patches) is reused: a new quant type only re-quantizes."""
    final, outtype = lay.drafter_gguf(), inputs["outtype"]
    if recipe.quantize in FLOAT_TYPES:  # the converter writes the final type itself
        console.step(f"converting {lay.drafter_dir.name} to {outtype} (log: {log})")
        report = _convert_to(lay, python, final, outtype, log, kept, facts)
        assert report is not None
        return report, None
    intermediate = lay.drafter_gguf(outtype)
    conv_inputs = {k: inputs[k] for k in ("sources", "llama_cpp", "converter_env", "outtype")}
    if force or not made_from(intermediate, conv_inputs):
        console.step(f"converting {lay.drafter_dir.name} to {outtype} (log: {log})")
        _convert_to(lay, python, intermediate, outtype, log, kept)
        write_json_atomic(provenance_path(intermediate), make_record(intermediate, outtype, conv_inputs))
    else:
        console.ok(f"{intermediate.name} is current: only quantizing")
    console.step(f"quantizing to {recipe.quantize}")
    return _quantize_to(intermediate, final, recipe.quantize, facts, log), intermediate


def convert(recipe: Recipe, models_dir: Path, force: bool = False,
            keep_intermediate: bool = True) -> ConvertResult:
    """F16/BF16 conversion + quantization + verification + provenance, as one idempotent stage."""
    # a second convert would clear this one's half-written GGUF as a killed run's leftover; a folder
    # this process cannot write still answers when the GGUF is current
    with locks.models_folder(models_dir, unwritable_ok=True) as unwritable:
        if unwritable is not None:
            return _finished(recipe, models_dir, force, unwritable)
        # the tree's converter script and gguf-py are run and recorded: not while a patch changes them
        with locks.vendor_tree(shared=True):
            return _convert(recipe, models_dir, force, keep_intermediate)


def _up_to_date(lay: layout.Layout, record: dict[str, Any]) -> ConvertResult:
    final = lay.drafter_gguf()
    console.ok(f"{final.name} is up to date ({final})")
    kept = record.get("intermediate")
    return ConvertResult(str(final), str(lay.gguf_dir / kept) if kept else None,
                         str(provenance_path(final)), False, 0.0, record["verified"])


def _finished(recipe: Recipe, models_dir: Path, force: bool, unwritable: OSError) -> ConvertResult:
    """`buun convert` in a models folder this process cannot write (a read-only mount, another
    user's folder): the GGUF when it is current, as a convert says it; else why nothing is done."""
    lay = layout.for_recipe(recipe, models_dir)
    try:
        facts = drafter.check_folder(recipe, models_dir)
        status, record = (stale("--force"), None) if force else judge(recipe, models_dir, facts)
    except BuunError as exc:
        status, record = stale(exc.message), None
    if record is None:
        raise UsageError(f"{lay.drafter_gguf().name} is to be made ({status.detail}), but {models_dir} cannot be "
                         f"written: {unwritable.strerror} ({unwritable.filename})",
                         "make the models folder writable, or give a writable one (--models-dir, BUUN_MODELS_DIR), "
                         "then run the same command again")
    return _up_to_date(lay, record)


def _convert(recipe: Recipe, models_dir: Path, force: bool, keep_intermediate: bool) -> ConvertResult:
    t0 = time.monotonic()
    facts = drafter.check_folder(recipe, models_dir)
    lay = layout.for_recipe(recipe, models_dir)
    final = lay.drafter_gguf()
    status, record = judge(recipe, models_dir, facts) if not force else (stale("--force"), None)
    if record is not None:
        return _up_to_date(lay, record)
    drafter.check_readable(recipe, models_dir)
    if recipe.quantize not in FLOAT_TYPES:
        build.find_binary("llama-quantize")  # fail before the long conversion, not after
    python = converter_python()
    outtype = recipe.quantize if recipe.quantize in FLOAT_TYPES else intermediate_type(facts)
    # the files as they are before they are hashed; checked again once the converter has read them
    before = file_stats(read_by_converter(recipe, models_dir))
    inputs = inputs_of(recipe, models_dir, python, outtype, rehash=True)  # byte for byte what the converter reads
    console.info(f"making {final.name}: {status.detail}")  # after the checks above, which say it better
    lay.gguf_dir.mkdir(parents=True, exist_ok=True)
    clear_leftovers(lay.gguf_dir, "partial")  # also a killed run's of a file this one does not write
    check_disk(lay, recipe)
    log = _log_path(recipe)
    for folder in (paths.state_dir(), log.parent):  # the log names the models and paths: the owner's, as state is
        private_dir(folder)
    with open_private(log, append=False):
        pass
    try:
        report, intermediate = _produce(lay, recipe, facts, python, inputs, log, force,
                                        lambda: check_sources_kept(recipe, models_dir, before, inputs["sources"]))
    except _NoRoom as exc:
        raise _disk_full(exc, lay, recipe, log) from None
    write_json_atomic(provenance_path(final), make_record(
        final, recipe.quantize, inputs, recipe={"name": recipe.name, "file": recipe.source.name},
        intermediate=intermediate.name if intermediate else None,
        converter={"script": "convert_hf_to_gguf.py",
                   "args": ["--outtype", outtype.lower(), "--target-model-dir", "<the tokenizer folder>"]},
        verified=report))
    if intermediate and not keep_intermediate:
        intermediate.unlink(missing_ok=True)
        provenance_path(intermediate).unlink(missing_ok=True)
    seconds = time.monotonic() - t0
    console.ok(f"{final.name}: {report['tensor_count']} tensors, {_size(final)}, verified ({seconds:.0f} s)")
    return ConvertResult(str(final), str(intermediate) if intermediate else None, str(provenance_path(final)),
                         True, seconds, report)


def _size(path: Path) -> str:
    return _amount(path.stat().st_size)


def _amount(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def require_converted(recipe: Recipe, models_dir: Path) -> Path:
    """For later stages (serve): the verified drafter GGUF, or an error saying to convert."""
    final = layout.for_recipe(recipe, models_dir).drafter_gguf()
    if not final.is_file() or not provenance_path(final).is_file():
        raise NotReadyError(f"the drafter GGUF {final} does not exist yet", f"run `buun convert {recipe.ref}`")
    return final
