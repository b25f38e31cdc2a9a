"""Options that command groups share, defined once; the log printing of `logs` commands and the
lines of `status`, servers' and workers' alike.

`--models-dir` is taken by every command that reads or writes models. The command resolves it
once (`paths.models_dir`: the option, else BUUN_MODELS_DIR, else the XDG data dir) and passes
the folder down; nothing below the command resolves it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from buun_tool.base import console, nvidia
from buun_tool.base.errors import UsageError
from buun_tool.server import logfile
from buun_tool.server.instance import Instance, InstanceT

# The panels of `buun --help`, in the order cli/app.py lists them
PIPELINE = "Pipeline (the stages of `buun setup`, in order)"
SERVER = "Server"
MEASURE = "Measure"
TOOLS = "Tools"


ScaleOpt = Annotated[str | None, typer.Option(
    "--scale", help="full: the real geometry; tiny: the recipe's CPU-test shrink (default: full with a GPU).",
    show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
RecipeArg = Annotated[str | None, typer.Argument(help="Recipe name or YAML file (default: qwen3.5-27b-dflash).",
                                                 show_default=False)]


def recipe_and_server_flags(recipe: str | None, args: list[str]) -> tuple[str | None, list[str]]:
    """A command's recipe and its flags for llama-server (the words after `--`). Click hands the
    first word after `--` to RECIPE when no recipe precedes it, so a "recipe" that starts with
    '-' is the first flag: `buun setup -- -c 16384` means the default recipe with -c 16384."""
    if recipe is not None and recipe.startswith("-"):
        return None, [recipe, *args]
    return recipe, list(args)


ModelsDirOpt = Annotated[Path | None, typer.Option(
    "--models-dir", show_default=False,
    help="Where models live (default: BUUN_MODELS_DIR, else ~/.local/share/buun/models).")]

FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")]
LinesOpt = Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines to show.")]


def show_log(path: Path, owner: str, lines: int, follow: bool) -> None:
    """The last lines of a supervised program's log (`owner` names it in the error), then, with
    `follow`, each new line until Ctrl-C; control characters (a client's ESC sequences that the
    server logged) are shown, not sent to the terminal."""
    if not path.exists() and not follow:
        raise UsageError(f"{owner} has no log yet ({path})")
    for line in logfile.tail(path, lines):
        console.out.print(console.printable(line), markup=False, highlight=False)
    if follow:
        try:
            for line in logfile.follow(path):
                console.out.print(console.printable(line), markup=False, highlight=False)
        except KeyboardInterrupt:
            pass


def show_statuses(found: Sequence[Any], named: bool, json_out: bool, show: Callable[[Any], None],
                  none: str) -> None:
    """What `status` prints of the instances or workers `found`: with --json one object for the one
    NAME gives, else a list; else each through `show`, and `none` when there is none."""
    if json_out:
        console.print_json(found[0].to_json() if named else [st.to_json() for st in found])
        return
    if not found:
        console.info(none)
    for st in found:
        show(st)


STATE_STYLE = {"ready": "green", "starting": "cyan", "backoff": "yellow", "stopping": "yellow", "failed": "red",
               "stopped": "dim"}


def status_header(title: str, state: str, extra: str = "") -> None:
    """A status's first line: what it is in bold, then its state in the state's colour."""
    console.out.print(f"[bold]{title}[/]  [{STATE_STYLE.get(state, 'white')}]{state}[/]{extra}")


def status_row(label: str, value: Any) -> None:
    """One `label  value` line of a status, none for an empty value; as text (a record's or a
    server's strings are no markup, and their control characters are shown, not sent)."""
    if value not in (None, "", []):
        console.out.print(console.printable(f"  {label:<10} {value}"), markup=False)


def duration(seconds: float | None) -> str | None:
    """An uptime or a wait: 4m07s, 2h05m, 3d01h; None for none."""
    if seconds is None:
        return None
    s = int(seconds)
    return f"{s // 86400}d{s % 86400 // 3600:02d}h" if s >= 86400 else (
        f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s")


def default_scale(scale: str | None) -> str:
    """--scale of the synthetic models: full (the real geometry) where a GPU runs them, else tiny."""
    if scale is None:
        return "full" if nvidia.detect_gpus() else "tiny"
    if scale not in ("full", "tiny"):
        raise UsageError(f"--scale {scale!r}: expected full or tiny")
    return scale


def stop_targets(name: str | None, all_: bool, known: list[InstanceT],
                 resolve: Callable[[str | None], InstanceT]) -> list[InstanceT]:
    """What `stop` (a server's or a worker's) stops: every one with --all, the one named, else the
    one `resolve` picks; none, rather than an error, when none is running and no single one is
    known: stopping what is stopped is done (`buun stop` in a script's cleanup)."""
    if all_:
        return known
    if name is None and len(known) != 1 and not any(_active(i) for i in known):
        return []
    return [resolve(name)]


def _active(inst: Instance) -> bool:
    """A supervisor holds it, or its record says running (its supervisor died: `stop` cleans up)."""
    record = inst.read()
    return inst.is_locked() or (record is not None and record.state.running)
