"""Recipes: one YAML file per model pair, validated on load.

A recipe says where the target, drafter and tokenizer come from, how the drafter is converted
and checked, the geometry of the real checkpoints (for synthetic models and the memory planner)
and the llama-server settings. Errors name the file, the dotted field and what is expected.

The geometry is typed (TargetGeometry, DrafterGeometry, one Geometry per scale) and its
cross-field rules run on load, so `buun recipes` refuses every recipe `buun synth`, `buun fit` or
`buun setup` would: they read `recipe.geometry_at(scale)`, built once.

The parts: the types (recipe_types.py), where recipes are found by name (recipe_files.py), the
YAML reader that refuses a key given twice (recipe_yaml.py), typed fields at dotted keys
(recipe_reader.py), the geometry's checks (recipe_geometry.py) and the schema with parse()
(recipe_schema.py); this module loads a recipe by name or path. Their names are recipes' too:
callers say recipes.Recipe, recipes.MAX_SLOTS, recipes.parse.
"""

from __future__ import annotations

from pathlib import Path

from buun_tool.formats.recipe_files import DEFAULT_RECIPE, available, reference
from buun_tool.formats.recipe_reader import is_index, shown
from buun_tool.formats.recipe_schema import MAX_SLOTS, QUANT_TYPES, RECIPE_REFUSED, parse
from buun_tool.formats.recipe_types import (
    FULL,
    GEOMETRY_KEYS,
    SPECIAL_TOKENS,
    DrafterGeometry,
    Geometry,
    Recipe,
    RecipeError,
    RepoSpec,
    TargetGeometry,
)
from buun_tool.formats.recipe_yaml import load_yaml

__all__ = [
    # recipe_files.py
    "DEFAULT_RECIPE", "available", "reference",
    # recipe_reader.py
    "is_index", "shown",
    # recipe_schema.py
    "MAX_SLOTS", "QUANT_TYPES", "RECIPE_REFUSED", "parse",
    # recipe_types.py
    "FULL", "GEOMETRY_KEYS", "SPECIAL_TOKENS", "DrafterGeometry", "Geometry", "Recipe", "RecipeError", "RepoSpec",
    "TargetGeometry",
    # recipe_yaml.py
    "load_yaml",
    # loading, this module's own
    "load_file", "load",
]


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
