"""The package reads as the pipeline: each folder of buun_tool/ is a layer and imports only from its
own layer and the ones below it (docs/design.md, "Layers"), and no modules import each other in a
circle. Read from the source (every import, a function's deferred ones too), so a shortcut taken
inside a function fails here as one at the top does."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buun_tool"

# Bottom to top. A module may import its own layer and any layer before it in this list.
LAYERS = ["base", "formats", "pipeline", "plan", "server", "measure", "app", "cli"]
# The package's own files outside the layers: the version and the entry point.
ROOTS = {"buun_tool", "buun_tool.__main__"}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# Over the limits when the layers were made, each held to its size then until it is split (issue
# #44): a module or function here may shrink, never grow, and leaves the list once under the limit.
OVERSIZE: dict[str, int] = {}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The buun_tool modules `name` imports: `from buun_tool.x import y` counts as buun_tool.x.y
    when y is a module, else as buun_tool.x."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("buun_tool")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.startswith("buun_tool"):
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return found - {name}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_module_is_in_a_layer() -> None:
    loose = sorted(n for n in modules() if n not in ROOTS and layer(n) not in LAYERS)
    assert loose == [], f"modules outside the layers {LAYERS}: {loose}"


def upward(g: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a layer above its own."""
    rank = {name: LAYERS.index(layer(name) or "cli") for name in set(g) | {d for ds in g.values() for d in ds}}
    return sorted(f"{name} -> {d}" for name, deps in g.items() if name not in ROOTS
                  for d in deps if d not in ROOTS and rank[d] > rank[name])


def test_no_import_runs_up_a_layer() -> None:
    assert upward(graph()) == []


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other_in_a_circle() -> None:
    g = {name: {d for d in deps if d != "buun_tool"} for name, deps in graph().items()}
    assert cycles(g) == []


def test_the_checks_find_what_they_look_for() -> None:
    """The walker sees deferred and relative imports, and the cycle finder a circle of three."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert upward({"buun_tool.base.paths": {"buun_tool.server.spec", "buun_tool.base.errors"},
                   "buun_tool.cli.app": {"buun_tool.base.paths"}}) == ["buun_tool.base.paths -> buun_tool.server.spec"]
    known = modules()
    cli_app = known["buun_tool.cli.app"]
    assert any(d.startswith("buun_tool.cli.") for d in imports("buun_tool.cli.app", cli_app, known))


def sizes() -> dict[str, int]:
    """Lines of each module ("layer/module.py") and of each function ("layer/module.py:name")."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel, text = str(path.relative_to(PACKAGE)), path.read_text()
        out[rel] = len(text.splitlines())
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                out[f"{rel}:{n.name}"] = max(out.get(f"{rel}:{n.name}", 0), n.end_lineno - n.lineno + 1)
    return out


def test_modules_and_functions_stay_small() -> None:
    found = sizes()
    limit = {name: MAX_FUNCTION_LINES if ":" in name else MAX_MODULE_LINES for name in found}
    over = sorted(f"{name}: {n} lines (at most {OVERSIZE.get(name, limit[name])})" for name, n in found.items()
                  if n > max(limit[name], OVERSIZE.get(name, 0)))
    assert over == [], "split it by job"
    shrunk = sorted(name for name, n in OVERSIZE.items() if found.get(name, 0) <= limit.get(name, MAX_MODULE_LINES))
    assert shrunk == [], "now within the limit: take it off OVERSIZE"
