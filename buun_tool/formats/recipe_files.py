"""Where recipes are found by name: the shipped ones in recipes/ and the user's own in the config
folder (theirs win), and how a command names the recipe read from a file."""

from __future__ import annotations

import shlex
from pathlib import Path

from buun_tool.base import paths

DEFAULT_RECIPE = "qwen3.5-27b-dflash"


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
