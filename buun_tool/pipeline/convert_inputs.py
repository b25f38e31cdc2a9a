"""What shapes a converted GGUF, as its provenance record names it: the source files (their
sha256, of the bytes the converter reads: a source that changed since `buun pull` verified it is
refused, and so is a GGUF whose sources changed while the converter read them), the llama.cpp pin
and applied patches, the converter's environment, llama-quantize's build, the intermediate type
and the quant.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from buun_tool.base import paths
from buun_tool.base.errors import BuunError, NotReadyError
from buun_tool.base.fsutil import sha256_file
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import build, drafter, vendor
from buun_tool.pipeline.convert_env import read_env_stamp
from buun_tool.pipeline.convert_verify import FLOAT_TYPES
from buun_tool.pipeline.pull import require_pulled, unchanged


def intermediate_type(facts: dict[str, Any]) -> str:
    """BF16 keeps a BF16 checkpoint exact; anything else converts to F16."""
    return "BF16" if str(facts.get("dtype") or "").lower() in ("bfloat16", "bf16") else "F16"



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


def read_by_converter(recipe: Recipe, models_dir: Path) -> list[Path]:
    """Every file the converter reads: the drafter's, the tokenizer's (--target-model-dir) and the
    drafter folder's copies of the tokenizer files (drafter.check_folder refuses any other)."""
    lay = layout.for_recipe(recipe, models_dir)
    return [*(lay.drafter_dir / n for n in recipe.drafter.files),
            *(lay.tokenizer_dir / n for n in recipe.repos()["tokenizer"].files),
            *(lay.drafter_dir / n for n in recipe.tokenizer.files)]


def file_stats(files: list[Path]) -> dict[Path, tuple[int, ...] | None]:
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


def check_sources_kept(recipe: Recipe, models_dir: Path, before: dict[Path, tuple[int, ...] | None],
                       sources: dict[str, Any]) -> None:
    """After the converter ran: the files it read are the ones hashed before it started, by their
    stat and by their bytes hashed again, and no file it would also read appeared. Else its GGUF
    is of bytes the record would not name: refused."""
    lay = layout.for_recipe(recipe, models_dir)
    want = {lay.drafter_dir / n: h for n, h in sources["drafter"]["files"].items()}
    want |= {lay.tokenizer_dir / n: h for n, h in sources["tokenizer"]["files"].items()}
    want |= {lay.drafter_dir / n: sources["tokenizer"]["files"].get(n) for n in recipe.tokenizer.files}
    now = file_stats(list(before))
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
        "converter_env": read_env_stamp(python.parent.parent),
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


def expected_inputs(recipe: Recipe, models_dir: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """inputs_of as a conversion now would record them, but the converter environment's (judged
    by convert_env.env_is_current) and without re-hashing sources whose size and mtime are as pulled."""
    outtype = recipe.quantize if recipe.quantize in FLOAT_TYPES else intermediate_type(facts)
    return {"sources": _sources(recipe, models_dir, rehash=False), "llama_cpp": _llama_state(), "outtype": outtype,
            "quantize": _quantize_build() if recipe.quantize not in FLOAT_TYPES else None, "quant": recipe.quantize}
