"""The YAML files buun reads from the user (recipes, vendor/pin.yaml): yaml.safe_load, but a key
given twice in one mapping is refused, naming both lines, where PyYAML keeps the last silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from buun_tool.base.errors import UsageError
from buun_tool.formats.recipe_types import RecipeError


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
