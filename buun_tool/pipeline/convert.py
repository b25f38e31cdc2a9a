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
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from buun_tool.base import console, locks, paths
from buun_tool.base.errors import DISK_FULL, BuunError, CommandError, Exit, NotReadyError, UsageError, disk_full
from buun_tool.base.fsutil import clear_leftovers, open_private, private_dir, replaced, sha256_file, write_json_atomic
from buun_tool.base.proc import run_logged
from buun_tool.formats import layout
from buun_tool.formats.gguf_tools import GLOBAL_TENSORS, LAYER_TENSORS, OPTIONAL_TENSORS, GgufFile
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import build, drafter, vendor
from buun_tool.pipeline.pull import DISK_RESERVE, disk_hint, require_pulled, unchanged
from buun_tool.pipeline.stage import StageStatus, current, stale

# The converter's dependencies. Its own requirements file pins torch 2.11 from the PyTorch CPU
# index, which many machines cannot reach; 2.13.0 from PyPI (or a local CPU wheel) works.
# transformers and numpy keep the converter's pins: it reads tokenizers through transformers.
CONVERTER_REQUIREMENTS = ("torch==2.13.0", "transformers==4.57.6", "numpy~=2.2.6")
ENV_STAMP = "buun-env.json"
FLOAT_TYPES = ("F32", "F16", "BF16")
# The provenance records' format. 2: the sources' hashes are of the bytes the converter read (1
# copied the manifest's, even of a file changed since), so a version 1 GGUF is made again.
PROVENANCE = 2


# --- the converter's environment ------------------------------------------------------------

def converter_env_dir(cache: Path | None = None) -> Path:
    return (cache or paths.cache_dir()) / "converter-env"


def _wanted_env() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "requirements": list(CONVERTER_REQUIREMENTS)}


def _read_env_stamp(env: Path) -> dict[str, Any] | None:
    try:
        return json.loads((env / ENV_STAMP).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _env_is_current(recorded: Any) -> bool:
    """Whether the converter environment a GGUF's record names is the one `converter_python`
    gives now, judged without making it: an interpreter of the user's own (BUUN_CONVERTER_PYTHON)
    or a made environment by its stamp; one not made yet (or to be made again) by what its
    requirements will install."""
    override = os.environ.get("BUUN_CONVERTER_PYTHON")
    if override:
        return recorded == _read_env_stamp(Path(shutil.which(override) or override).parent.parent)
    env = converter_env_dir()
    stamp = _read_env_stamp(env)
    if (env / "bin" / "python").is_file() and stamp and {k: stamp.get(k) for k in _wanted_env()} == _wanted_env():
        return recorded == stamp
    return isinstance(recorded, dict) and {k: recorded.get(k) for k in _wanted_env()} == _wanted_env()


def converter_python(cache: Path | None = None) -> Path:
    """The Python of the converter's environment, created on first use.

    A venv of its own, WITHOUT --system-site-packages: the converter needs transformers 4.57,
    which needs huggingface_hub < 1.0, while buun runs on huggingface_hub 2.x; and installing
    torch must not touch the user's own environment.
    """
    override = os.environ.get("BUUN_CONVERTER_PYTHON")
    if override:  # an interpreter that already has torch and transformers: offline machines
        return Path(shutil.which(override) or override)
    env = converter_env_dir(cache)
    python = env / "bin" / "python"
    if _env_made(env):
        return python
    # one environment for every models folder: the first converts of two folders made it at once,
    # each starting by removing the other's half-made one
    with locks.converter_env(env):
        if _env_made(env):  # made by the command this one waited for
            return python
        _make_env(env, python)
    return python


def _env_made(env: Path) -> bool:
    """Whether `env` is a whole environment for this buun's requirements: its stamp is written last."""
    stamp = _read_env_stamp(env) or {}
    return (env / "bin" / "python").is_file() and {k: stamp.get(k) for k in _wanted_env()} == _wanted_env()


def _make_env(env: Path, python: Path) -> None:
    log = env.parent / "converter-env.log"
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    console.step(f"creating the converter environment in {env} (torch CPU, transformers; once)")
    hint = ("the converter's packages come from PyPI; see the log. `python -m venv` needs the venv module "
            "(Debian: apt-get install python3-venv)")
    try:
        run_logged([sys.executable, "-m", "venv", env], log, what="creating the converter venv", hint=hint)
        run_logged([python, "-m", "pip", "install", "--disable-pip-version-check", *CONVERTER_REQUIREMENTS],
                   log, what="installing the converter's packages", hint=hint)
        installed = subprocess.run(
            [python, "-c", "import json, numpy, torch, transformers; print(json.dumps({'torch': torch.__version__, "
             "'transformers': transformers.__version__, 'numpy': numpy.__version__}))"],
            capture_output=True, text=True, check=True).stdout
    except BaseException:
        shutil.rmtree(env, ignore_errors=True)  # half an environment must not pass for a whole one
        raise
    (env / ENV_STAMP).write_text(json.dumps({**_wanted_env(), "installed": json.loads(installed)}, indent=2) + "\n")


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


def intermediate_type(facts: dict[str, Any]) -> str:
    """BF16 keeps a BF16 checkpoint exact; anything else converts to F16."""
    return "BF16" if str(facts.get("dtype") or "").lower() in ("bfloat16", "bf16") else "F16"


def _log_path(recipe: Recipe) -> Path:
    return paths.state_dir() / "logs" / f"convert-{recipe.name}.log"


def provenance_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".provenance.json")


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


# --- verification ---------------------------------------------------------------------------

def expected_tensors(n_layers: int) -> set[str]:
    names = {f"{g}.weight" for g in GLOBAL_TENSORS}
    names |= {f"blk.{i}.{t}.weight" for i in range(n_layers) for t in LAYER_TENSORS}
    return names


def _file_type(quant: str) -> int:
    import gguf

    return int(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType[f"MOSTLY_{quant}"])


def _read_back(f: GgufFile) -> dict[str, Any]:
    arch = f.get("general.architecture")
    types: dict[str, int] = {}
    for t in f.tensors:
        types[t.ggml_type.name] = types.get(t.ggml_type.name, 0) + 1
    tokens = f.kv.get("tokenizer.ggml.tokens")
    return {
        "architecture": arch,
        "block_size": f.get(f"{arch}.block_size"),
        "mask_token_id": f.get("tokenizer.ggml.mask_token_id"),
        "target_layers": f.get(f"{arch}.target_layers"),
        "hidden_size": f.get(f"{arch}.embedding_length"),
        "block_count": f.get(f"{arch}.block_count"),
        "rope_sections": f.get(f"{arch}.rope.dimension_sections"),
        "vocab_tokens": tokens.count if tokens else 0,
        "file_type": f.get("general.file_type"),
        "tensor_count": len(f.tensors),
        "tensor_types": dict(sorted(types.items())),
    }


def verify(path: Path, facts: dict[str, Any], quant: str) -> dict[str, Any]:
    """Read the GGUF back and compare it with what the configs say; raise with every mismatch."""
    with GgufFile(path) as f:
        got = _read_back(f)
        names = {t.name for t in f.tensors}
        floats = sorted(t.name for t in f.tensors if len(t.dims) >= 2 and t.ggml_type.name in FLOAT_TYPES)
    want = {
        "architecture": "dflash",
        "block_size": facts["block_size"],
        "mask_token_id": facts["mask_token_id"],
        "target_layers": [i + 1 for i in facts["target_layer_ids"]],  # upstream stores layer ids + 1
        "hidden_size": facts["target_hidden_size"],
        "block_count": facts["num_hidden_layers"],
        "vocab_tokens": facts["target_vocab_size"],
        "file_type": _file_type(quant),
    }
    problems = [f"{k}: expected {v!r}, found {got[k]!r}" for k, v in want.items() if got[k] != v]
    if facts.get("target_mrope") and not got["rope_sections"]:
        problems.append("rope.dimension_sections: missing (the target uses M-RoPE)")
    need = expected_tensors(facts["num_hidden_layers"])
    if need - names:
        problems.append(f"missing tensors: {', '.join(sorted(need - names))}")
    if names - need - set(OPTIONAL_TENSORS):
        problems.append(f"unexpected tensors: {', '.join(sorted(names - need - set(OPTIONAL_TENSORS)))}")
    if quant not in FLOAT_TYPES and floats:
        problems.append(f"not quantized to {quant}: {', '.join(floats)}")
    if problems:
        raise BuunError(f"{path.name} failed verification:\n  " + "\n  ".join(problems),
                        "the converter or the patches produced an unexpected file; see the convert log")
    return got


# --- provenance -----------------------------------------------------------------------------

def _gguf_py_version(llama: Path) -> str | None:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (llama / "gguf-py" / "pyproject.toml").read_text(), re.M)
    return m.group(1) if m else None


def _llama_state() -> dict[str, Any]:
    llama = vendor.require_vendored()
    try:
        source = build.source_state(llama)
    except BuunError:
        source = None
    return {"pin": vendor.load_pin().commit, "source": source, "gguf_py": _gguf_py_version(llama)}


def _quantize_build() -> dict[str, Any] | None:
    binary = build.find_binary("llama-quantize")
    for variant in build.VARIANTS:
        if paths.build_dir(variant) / "bin" == binary.parent:
            stamp = build.read_stamp(variant) or {}
            return {"variant": variant, "source": stamp.get("source"), "pin": stamp.get("pin")}
    return {"variant": None, "binary": str(binary)}


def _sources(recipe: Recipe, models_dir: Path, rehash: bool) -> dict[str, Any]:
    """The source files as they are on disk now: their sha256, read again with `rehash` (before a
    conversion: the record must name what the converter reads), else the manifest's while a file
    keeps the size and mtime it was hashed with. A file that no longer matches what `buun pull`
    verified is refused: the GGUF would be made from bytes the recipe does not name."""
    out, changed = {}, []
    for role in ("drafter", "tokenizer"):
        folder, manifest = require_pulled(recipe, role, models_dir)
        files = {}
        for name, entry in sorted(manifest["files"].items()):
            path = folder / name
            files[name] = entry["sha256"] if not rehash and unchanged(path, entry) else sha256_file(path)
            if files[name] != entry["sha256"]:
                changed.append(f"{path} (sha256 {files[name][:16]}, `buun pull` verified {entry['sha256'][:16]})")
        out[role] = {"repo": manifest["repo"], "revision": manifest["revision"], "commit": manifest["commit"],
                     "files": files}
    if changed:
        raise NotReadyError("source files changed on disk since `buun pull` verified them:\n  " + "\n  ".join(changed),
                            f"run `buun pull --verify {recipe.ref}` (it downloads them again), "
                            f"then `buun convert {recipe.ref}`")
    drafter_dir = layout.for_recipe(recipe, models_dir).drafter_dir  # the converter reads the tokenizer's copies there
    stale = [str(drafter_dir / n) for n in recipe.tokenizer.files
             if sha256_file(drafter_dir / n) != out["tokenizer"]["files"].get(n)]
    if stale:
        raise NotReadyError("the drafter folder's copies of the tokenizer files differ from the tokenizer's:\n  "
                            + "\n  ".join(stale),
                            f"run `buun drafter {recipe.ref}`, then `buun convert {recipe.ref}`")
    return out


def _read_by_converter(recipe: Recipe, models_dir: Path) -> list[Path]:
    """Every file the converter reads: the drafter's, the tokenizer's (--target-model-dir) and the
    drafter folder's copies of the tokenizer files (drafter.check_folder refuses any other)."""
    lay = layout.for_recipe(recipe, models_dir)
    return [*(lay.drafter_dir / n for n in recipe.drafter.files),
            *(lay.tokenizer_dir / n for n in recipe.repos()["tokenizer"].files),
            *(lay.drafter_dir / n for n in recipe.tokenizer.files)]


def _stats(files: list[Path]) -> dict[Path, tuple[int, ...] | None]:
    """Each file's identity and last change. The ctime moves with any write and cannot be set back
    (a utime that restores the mtime moves it too)."""
    out: dict[Path, tuple[int, ...] | None] = {}
    for f in files:
        try:
            st = f.stat()
            out[f] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            out[f] = None
    return out


def _check_sources_kept(recipe: Recipe, models_dir: Path, before: dict[Path, tuple[int, ...] | None],
                        sources: dict[str, Any]) -> None:
    """After the converter ran: the files it read are the ones hashed before it started, by their
    stat and by their bytes hashed again, and no file it would also read appeared. Else its GGUF
    is of bytes the record would not name: refused."""
    lay = layout.for_recipe(recipe, models_dir)
    want = {lay.drafter_dir / n: h for n, h in sources["drafter"]["files"].items()}
    want |= {lay.tokenizer_dir / n: h for n, h in sources["tokenizer"]["files"].items()}
    want |= {lay.drafter_dir / n: sources["tokenizer"]["files"].get(n) for n in recipe.tokenizer.files}
    now = _stats(list(before))
    changed = [str(f) for f in before if now[f] != before[f]
               or (now[f] is not None and sha256_file(f) != want.get(f))]
    stray = [str(p) for p in drafter.stray_files(recipe, models_dir)]
    if changed or stray:
        raise NotReadyError(
            "the converter's sources changed while it read them; the GGUF it made was discarded and the "
            "previous one is kept:\n  " + "\n  ".join([*(f"{f} (changed)" for f in changed),
                                                         *(f"{f} (appeared)" for f in stray)]),
            ("move the files that appeared out of the folder; " if stray else "")
            + f"run `buun pull --verify {recipe.ref}` (it downloads a changed file again) and "
              f"`buun drafter {recipe.ref}`, then `buun convert {recipe.ref}`")


def conversion_inputs(recipe: Recipe, models_dir: Path, python: Path, outtype: str,
                      rehash: bool = False) -> dict[str, Any]:
    """Everything that shapes the converter's output bytes."""
    return {
        "sources": _sources(recipe, models_dir, rehash),
        "llama_cpp": _llama_state(),
        "converter_env": _read_env_stamp(python.parent.parent),
        "outtype": outtype,
    }


def inputs_of(recipe: Recipe, models_dir: Path, python: Path, outtype: str,
              rehash: bool = False) -> dict[str, Any]:
    """Everything that shapes the final GGUF; equal inputs mean the stage has nothing to do."""
    return {
        **conversion_inputs(recipe, models_dir, python, outtype, rehash),
        "quantize": _quantize_build() if recipe.quantize not in FLOAT_TYPES else None,
        "quant": recipe.quantize,
    }


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


def _expected_inputs(recipe: Recipe, models_dir: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """inputs_of as a conversion now would record them, but the converter environment's (judged
    by _env_is_current) and without re-hashing sources whose size and mtime are as pulled."""
    outtype = recipe.quantize if recipe.quantize in FLOAT_TYPES else intermediate_type(facts)
    return {"sources": _sources(recipe, models_dir, rehash=False), "llama_cpp": _llama_state(), "outtype": outtype,
            "quantize": _quantize_build() if recipe.quantize not in FLOAT_TYPES else None, "quant": recipe.quantize}


def _judge(recipe: Recipe, models_dir: Path, facts: dict[str, Any]) -> tuple[StageStatus, dict[str, Any] | None]:
    """The stage's status and, when current, the final GGUF's provenance record."""
    final = layout.for_recipe(recipe, models_dir).drafter_gguf()
    record, why = _intact(final)
    if record is None:
        return stale(why), None
    try:
        want = _expected_inputs(recipe, models_dir, facts)
    except BuunError as exc:  # a source changed on disk, no llama-quantize: the conversion says what to do
        return stale(exc.message), None
    got = record.get("inputs") or {}
    changed = [k for k in want if got.get(k) != want[k]]
    if not _env_is_current(got.get("converter_env")):
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
    return _judge(recipe, models_dir, facts)[0]


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


def _current(gguf: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The provenance record of `gguf` when the file is intact and was made from `inputs`."""
    record, _ = _intact(gguf)
    return record if record is not None and record.get("inputs") == inputs else None


def _record(gguf: Path, kind: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A provenance record. No timestamps or paths: equal inputs give an equal record."""
    return {"buun_provenance": PROVENANCE,
            "output": {"file": gguf.name, "size": gguf.stat().st_size, "sha256": sha256_file(gguf), "type": kind},
            **extra, "inputs": inputs}


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
    if force or not _current(intermediate, conv_inputs):
        console.step(f"converting {lay.drafter_dir.name} to {outtype} (log: {log})")
        _convert_to(lay, python, intermediate, outtype, log, kept)
        write_json_atomic(provenance_path(intermediate), _record(intermediate, outtype, conv_inputs))
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
        status, record = (stale("--force"), None) if force else _judge(recipe, models_dir, facts)
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
    status, record = _judge(recipe, models_dir, facts) if not force else (stale("--force"), None)
    if record is not None:
        return _up_to_date(lay, record)
    drafter.check_readable(recipe, models_dir)
    if recipe.quantize not in FLOAT_TYPES:
        build.find_binary("llama-quantize")  # fail before the long conversion, not after
    python = converter_python()
    outtype = recipe.quantize if recipe.quantize in FLOAT_TYPES else intermediate_type(facts)
    # the files as they are before they are hashed; checked again once the converter has read them
    before = _stats(_read_by_converter(recipe, models_dir))
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
                                        lambda: _check_sources_kept(recipe, models_dir, before, inputs["sources"]))
    except _NoRoom as exc:
        raise _disk_full(exc, lay, recipe, log) from None
    write_json_atomic(provenance_path(final), _record(
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
