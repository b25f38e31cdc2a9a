"""Reading a recipe's YAML data: each field at its dotted key, of the type it must have, and an
error naming the file, the key and what was expected (the value quoted, cut short)."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

from buun_tool.formats.recipe_types import RecipeError, RepoSpec

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


class Reader:
    """A recipe's data (`source` read), field by field."""

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
