"""`buun setup`: doctor -> vendor -> patch -> build -> pull -> drafter -> convert -> serve -> smoke test.

    buun setup [RECIPE] [--yes] [--cpu] [--dry-run] [--verbose] [--models-dir DIR] [--recipe-file PATH]
               [--host H] [--port P] [--api-key KEY | --no-api-key] [-- LLAMA_SERVER_FLAGS...]
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from buun_tool.app import setup as setup_stage
from buun_tool.base import command, console, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import UsageError
from buun_tool.cli.options import ModelsDirOpt, RecipeArg, recipe_and_server_flags
from buun_tool.formats import recipes
from buun_tool.pipeline import doctor
from buun_tool.server import spec as spec_mod
from buun_tool.server.settings import API_KEY_ENV

_STYLE = {"skip": "green", "run": "yellow", "check": "cyan"}


def setup(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    recipe_file: Annotated[Path | None, typer.Option("--recipe-file", help="A recipe YAML file of your own.")] = None,
    models_dir: ModelsDirOpt = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="Build for the CPU (machines without a GPU, CI).")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and exit.")] = False,
    host: Annotated[str, typer.Option("--host", help="Address the server binds.")] = spec_mod.DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port of the server.")] = spec_mod.DEFAULT_PORT,
    api_key: Annotated[str | None, typer.Option("--api-key", help="Require this key from clients.",
                                                envvar=API_KEY_ENV, show_envvar=False)] = None,
    no_api_key: Annotated[bool, typer.Option("--no-api-key", help="Serve beyond loopback without an API key, "
                                             "on purpose (else refused).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Name each patch the patch stage applies.")
                       ] = False,
    no_tune: Annotated[bool, typer.Option("--no-tune", help="Skip the tune stage (`buun tune`): serve the recipe's "
                                          "settings, or those of an earlier tune still fresh.")] = False,
) -> None:
    """Set up everything and start the server: each stage is skipped when already done.

    Flags after `--` go to llama-server, overriding the recipe's (e.g. `-- -c 16384`)."""
    recipe, extra = recipe_and_server_flags(recipe, ctx.args)
    if recipe and recipe_file:
        raise UsageError("give a recipe name or --recipe-file, not both")
    r = recipes.load(str(recipe_file) if recipe_file else recipe)
    # before any stage: an open bind without a key, or a port that cannot be, would only be refused
    # at the last one, after the downloads and the build
    spec_mod.check_port(port)
    flags = command.merge(command.recipe_flags(r.server_flags), command.parse_args(extra))
    command.check_exposure(host, flags, api_key, no_api_key)
    context = setup_stage.Context(r, models_dir=paths.models_dir(models_dir), cpu=cpu, host=host, port=port,
                                  api_key=api_key, no_api_key=no_api_key, extra=extra, verbose=verbose,
                                  tune=not no_tune)
    if dry_run:
        _print_plan(context)
        return
    try:
        spec, result = setup_stage.run(context, yes=yes)
    except setup_stage.Declined:
        console.info("setup cancelled; nothing was changed")
        return
    console.out.print(setup_stage.summary(spec, result, has_key=bool(context.api_key)))
    if spec.tuned:  # the last word: what this card measured, against AR
        console.ok(f"measured on this card: {spec.tuned}")


def _print_plan(context: setup_stage.Context) -> None:
    table = Table(box=None, show_header=True, header_style="bold")
    for col in ("stage", "action", "what"):
        table.add_column(col)
    rows = setup_stage.plan(context)
    for row in rows:
        table.add_row(row.stage, f"[{_STYLE[row.action]}]{row.action}[/]", row.what)
    console.out.print(table)
    for row in rows:  # long details below the table, where they are not wrapped into a column
        if row.detail:
            label = "server command" if row.stage == "serve" else row.stage
            console.out.print(f"{label}: {row.detail}", markup=False)
    root = context.layout.root
    probe = next((p for p in [root, *root.parents] if p.exists()), Path("/"))
    console.out.print(f"disk: {doctor.disk_needed(context.recipe) / 2**30:.1f} GiB needed in all for "
                      f"{context.recipe.name}, {shutil.disk_usage(probe).free / 2**30:.1f} GiB free at {probe}")
    console.out.print(f"models: {root}   state: {paths.state_dir()}")


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import PIPELINE

    app.command(rich_help_panel=PIPELINE,
                context_settings={"allow_extra_args": True})(setup)
