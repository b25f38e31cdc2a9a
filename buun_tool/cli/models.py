"""`buun pull`, `buun drafter`, `buun convert`, `buun recipes`, `buun gguf`: the model pipeline.

    buun pull [RECIPE] [--only drafter,tokenizer] [--verify]   download the recipe's repos (resumable)
    buun drafter [RECIPE]                  copy the tokenizer files into the drafter folder, check it
    buun convert [RECIPE] [--force]        drafter -> BF16/F16 GGUF -> the recipe's quant, verified
    buun recipes                           list the recipes (name, description, file)
    buun gguf inspect FILE                 architecture, hyperparameters, tensors by type
    buun gguf migrate IN OUT [--target T] [--force]  a buun-fork drafter GGUF -> upstream's DFlash format

RECIPE is a recipe name (see `buun recipes`) or the path of a recipe YAML file. Every command
takes --models-dir (default: BUUN_MODELS_DIR or ~/.local/share/buun/models) and --json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from buun_tool.base import console, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import UsageError
from buun_tool.cli.options import ModelsDirOpt
from buun_tool.formats import recipes

RecipeArg = Annotated[str | None, typer.Argument(help="Recipe name or YAML file (default: qwen3.5-27b-dflash).",
                                                 show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def pull(
    recipe: RecipeArg = None,
    models_dir: ModelsDirOpt = None,
    only: Annotated[str | None, typer.Option(
        "--only", help="Comma-separated roles to pull: target, drafter, tokenizer (default: all).")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash files already on disk.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Download the target GGUF, the drafter and the tokenizer (gated/missing repos fail early)."""
    from buun_tool.pipeline import pull as pull_stage

    roles = pull_stage.ROLES
    if only:
        roles = tuple(r.strip() for r in only.split(",") if r.strip())
        bad = [r for r in roles if r not in pull_stage.ROLES]
        if bad or not roles:
            raise UsageError(f"--only: unknown role(s) {', '.join(bad) or '(none)'}",
                             f"valid: {', '.join(pull_stage.ROLES)}")
    result = pull_stage.pull(recipes.load(recipe), paths.models_dir(models_dir), roles=roles, verify=verify)
    if json_out:
        console.print_json(result.to_json())


def drafter(recipe: RecipeArg = None, models_dir: ModelsDirOpt = None, json_out: JsonOpt = False) -> None:
    """Copy the target's tokenizer files into the drafter folder and check the pair fits."""
    from buun_tool.pipeline import drafter as drafter_stage

    result = drafter_stage.prepare(recipes.load(recipe), paths.models_dir(models_dir))
    if json_out:
        console.print_json(result.to_json())


def convert(
    recipe: RecipeArg = None,
    models_dir: ModelsDirOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if nothing changed.")] = False,
    drop_intermediate: Annotated[bool, typer.Option(
        "--drop-intermediate", help="Delete the BF16/F16 GGUF once the quantized one is verified.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Convert the drafter to GGUF, quantize it to the recipe's type and verify it."""
    from buun_tool.pipeline import convert as convert_stage

    result = convert_stage.convert(recipes.load(recipe), paths.models_dir(models_dir), force=force,
                                   keep_intermediate=not drop_intermediate)
    if json_out:
        console.print_json(result.to_json())


def list_recipes(json_out: JsonOpt = False) -> None:
    """List the recipes: the shipped ones and yours (in the config dir's recipes/)."""
    rows = []
    for name, path in sorted(recipes.available().items()):
        try:
            r = recipes.load_file(path)
            rows.append({"name": r.name, "description": r.description, "source": str(path), "error": None})
        except recipes.RecipeError as exc:  # one broken file must not hide the others
            rows.append({"name": name, "description": "", "source": str(path), "error": exc.message})
    if json_out:
        console.print_json(rows)
        return
    table = Table(box=None, header_style="bold")
    for col in ("name", "description", "file"):
        table.add_column(col)
    for row in rows:
        desc = Text(row["description"]) if not row["error"] else console.labelled("invalid:", "red", row["error"])
        table.add_row(row["name"], desc, row["source"])
    console.out.print(table)


gguf_app = typer.Typer(help="Inspect GGUF files; migrate buun-fork drafters to upstream's format.",
                       no_args_is_help=True)


def _literal(value: Any) -> Text:
    """A value read from a GGUF (a file from anywhere: its keys, names and strings are the author's),
    shown as it is: neither rich markup (`[link=...]`, a stray `[/]` that would crash the command)
    nor control characters reach the terminal."""
    return Text(console.printable(str(value)))


def _show_inspect(info: dict[str, Any]) -> None:
    out = console.out
    out.print(Text.assemble((console.printable(info["file"]), "bold"), f"  {_size(info['size'])}, "
                            f"GGUF v{info['version']}"))
    out.print(Text.assemble("architecture: ", (console.printable(str(info["architecture"])), "bold"),
                            f"   file type: {info['file_type'] or '-'}   name: ",
                            _literal(info["general"].get("name", "-"))))
    for title, key in (("hyperparameters", "hparams"), ("tokenizer", "tokenizer"), ("other keys", "other")):
        if info[key]:
            table = Table(title=title, title_justify="left", box=None, show_header=False)
            table.add_column(style="cyan")
            table.add_column()
            for k, v in info[key].items():
                table.add_row(_literal(k), _literal(v))
            out.print(table)
    t = info["tensors"]
    out.print(_literal(f"tensors: {t['count']} ({t['parameters']:,} parameters), {t['layers']} layer(s); "
                       f"global: {', '.join(t['global']) or '-'}"))
    table = Table(title="size by type", title_justify="left", box=None)
    for col in ("type", "tensors", "size"):
        table.add_column(col)
    for name, e in t["by_type"].items():
        table.add_row(name, str(e["count"]), _size(e["bytes"]))
    out.print(table)
    if t["per_layer"]:
        out.print(_literal("per layer: " + ", ".join(f"{k} x{n}" for k, n in t["per_layer"].items())))


@gguf_app.command("inspect")
def gguf_inspect(
    path: Annotated[Path, typer.Argument(help="A GGUF file.")],
    json_out: JsonOpt = False,
) -> None:
    """Architecture, key hyperparameters, tokenizer summary, tensors and size by type."""
    from buun_tool.formats import gguf_tools

    info = gguf_tools.inspect(path)
    if json_out:
        console.print_json(info)
    else:
        _show_inspect(info)


@gguf_app.command("migrate")
def gguf_migrate(
    src: Annotated[Path, typer.Argument(help="A drafter GGUF in the buun fork's format (dflash-draft).")],
    dst: Annotated[Path, typer.Argument(help="Where to write the upstream-format (dflash) GGUF.")],
    target: Annotated[Path | None, typer.Option(
        "--target", help="The target GGUF: vocabulary (if the drafter has none), M-RoPE, geometry check.")] = None,
    mrope: Annotated[bool | None, typer.Option(
        "--mrope/--no-mrope", help="Whether the target uses M-RoPE (default: read from --target).",
        show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Rewrite a buun-fork drafter GGUF in the format the pinned upstream llama.cpp loads."""
    from buun_tool.formats import gguf_tools

    report = gguf_tools.migrate(src, dst, target, mrope, force)
    if json_out:
        console.print_json(report)
    else:
        console.ok(f"wrote {dst}: {report['tensors']} tensors ({len(report['renamed_tensors'])} renamed)"
                   + (f", added {', '.join(report['added'])}" if report["added"] else "")
                   + (", vocabulary from the target" if report["vocabulary_from"] != "source" else ""))


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import PIPELINE, TOOLS

    app.command(rich_help_panel=PIPELINE)(pull)
    app.command(rich_help_panel=PIPELINE)(drafter)
    app.command(rich_help_panel=PIPELINE)(convert)
    app.command("recipes", rich_help_panel=TOOLS)(list_recipes)
    app.add_typer(gguf_app, name="gguf", rich_help_panel=TOOLS)
