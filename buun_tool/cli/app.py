"""The registry: every command group is wired here, in pipeline order.

Each module in buun_tool/cli/ holds one group of commands and registers them with
`register(app)`; this file only decides the order `buun --help` shows them in and turns
BuunError into a message, a hint and an exit code (a traceback only with BUUN_DEBUG=1).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any

import click
import typer
from typer.core import TyperGroup

from buun_tool import __version__
from buun_tool.base.console import err, labelled
from buun_tool.base.errors import DISK_FULL, PATH_ERRORS, BuunError, disk_full, exit_interrupted, path_error

# The order of `buun --help`: the pipeline first, as `buun setup` runs it.
ORDER = ("setup", "doctor", "vendor", "patch", "build", "pull", "drafter", "convert", "serve", "start", "stop",
         "restart", "status", "logs", "service", "worker", "synth", "bench", "fit", "recipes", "gguf")


class _Group(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(self.commands)
        return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), names.index(n)))

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # typer turns a Ctrl-C while it parses the arguments into a silent exit 130
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            exit_interrupted()

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except BuunError as exc:
            if os.environ.get("BUUN_DEBUG"):
                raise
            _report(ctx, exc)
        except OSError as exc:  # a full disk, or a path unfit for its use, can meet any write or read
            if os.environ.get("BUUN_DEBUG"):
                raise
            if exc.errno in DISK_FULL:
                _report(ctx, disk_full(exc))
            elif exc.errno in PATH_ERRORS and exc.filename:
                _report(ctx, path_error(exc))
            raise
        except (KeyboardInterrupt, typer.Abort):  # Abort: Ctrl-C at a confirmation prompt
            exit_interrupted()


def _report(ctx: click.Context, exc: BuunError) -> None:
    # the message and hint are literal text (paths, YAML errors, `pip install -e '.[bench]'`)
    err.print(labelled("error:", "bold red", exc.message))
    if exc.hint:
        err.print(labelled("hint:", "bold", exc.hint))
    ctx.exit(int(exc.exit_code))


app = typer.Typer(
    cls=_Group,
    name="buun",
    help="A DFlash speculative-decoding server for Qwen3.5-27B on llama.cpp, in one command.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"buun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    pass


def _register_all() -> None:
    """Each command group registers its commands, in the order --help lists them."""
    from buun_tool.cli import fit_cmd, foundation, measure, models, server, setup_cmd, tune_cmd, worker

    for module in (foundation, models, server, worker, measure, tune_cmd, fit_cmd, setup_cmd):
        module.register(app)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Each paragraph of a command's help on one line, for the terminal to wrap: typer's rich help
    keeps the docstring's line breaks after the first paragraph, so a sentence wrapped at 120
    columns in the source broke in the middle of an 80-column terminal's line."""
    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = "\n\n".join(re.sub(r"\s*\n\s*", " ", p) for p in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _unwrap_help(group.typer_instance)


_register_all()
_unwrap_help(app)


def main() -> None:
    sys.exit(app())
