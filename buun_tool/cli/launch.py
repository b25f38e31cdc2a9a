"""The options `buun serve`, `buun start` and `buun service install` share, defined once.

    @launch_command
    def start(opts: LaunchOptions, wait: WaitOpt = True) -> None: ...

`launch_command` gives a command the shared options (the parameters of `_bundle`, in this order,
before its own) and calls it with them bundled in one LaunchOptions; `opts.resolve()` makes the
launch spec. A shared option is added, renamed or documented here, once, for all three.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from buun_tool.base import paths
from buun_tool.base.errors import UsageError
from buun_tool.cli.options import ModelsDirOpt, RecipeArg, recipe_and_server_flags
from buun_tool.plan import devices
from buun_tool.server import spec as spec_mod
from buun_tool.server.settings import API_KEY_ENV

SUPERVISION = "Supervision"

NameOpt = Annotated[str | None, typer.Option("--name", help="Instance name (default: the recipe's name).")]
ModelOpt = Annotated[Path | None, typer.Option("--model", help="Target GGUF (default: the one `buun pull` made).")]
DraftOpt = Annotated[Path | None, typer.Option("--draft", help="DFlash drafter GGUF (default: `buun convert`'s).")]
HostOpt = Annotated[str, typer.Option(
    "--host", help="Address to bind. Anything but loopback (127.0.0.1, ::1, localhost) lets other machines in: "
    "buun refuses it without an API key (--api-key, BUUN_API_KEY, the recipe's or `-- --api-key-file FILE`) "
    "unless --no-api-key is given.")]
NoKeyOpt = Annotated[bool, typer.Option(
    "--no-api-key", help="Serve beyond loopback without an API key, on purpose: anyone who reaches the port "
    "can use the server.")]
PortOpt = Annotated[int, typer.Option("--port", help="Port to listen on.")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar=API_KEY_ENV, show_envvar=True, show_default=False,
    help="API key clients must send; handed to llama-server via LLAMA_API_KEY, never stored or shown.")]
TreeBudgetOpt = Annotated[int | None, typer.Option(
    "--tree-budget", metavar="N", show_default=False,
    help="Draft nodes of the DDTree verified per step (llama-server's --spec-tree-budget; patch 0023); 0 or 1 "
    "verifies the chain. Default: the recipe's server.tree.budget.")]
SlotsOpt = Annotated[int | None, typer.Option(
    "--slots", metavar="N", show_default=False,
    help="Requests served at once (llama-server's -np), 1 to 8; each slot gets -c / N tokens of context. "
    "Default: the recipe's server.slots. `buun fit --slots N` shows the context each can have.")]
RpcOpt = Annotated[str | None, typer.Option(
    "--rpc", metavar="HOST:PORT,...", show_default=False,
    help="Split the model over these RPC workers (`buun worker start` on each; llama-server's --rpc). Each must "
    "answer before the launch; the drafter goes on the device that holds the target's last layers and output "
    "matrix, which it shares. docs/serving.md: \"Other machines\".")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", metavar="0,1", show_default=False,
    help="The cards to run on, by nvidia-smi index; several split the target by layers (-sm layer, -ts from "
    "`buun fit --gpus`). Default: the recipe's server.gpus, else every card CUDA finds.")]
DraftGpuOpt = Annotated[int | None, typer.Option(
    "--draft-gpu", metavar="N", show_default=False,
    help="The card of the drafter, one of --gpus (default: the last, which holds the target's last layers).")]
DropOpt = Annotated[list[str] | None, typer.Option("--drop", metavar="FLAG",
                                                  help="Leave out a recipe flag (repeatable): --drop -cd.")]
ReadyTimeout = Annotated[float, typer.Option(help="Seconds without load progress before giving up.",
                                             rich_help_panel=SUPERVISION)]
HealthInterval = Annotated[float, typer.Option(help="Seconds between /health checks when ready.",
                                               rich_help_panel=SUPERVISION)]
HealthTimeout = Annotated[float, typer.Option(help="Seconds one /health check may take.", rich_help_panel=SUPERVISION)]
HealthFailures = Annotated[int, typer.Option(help="Failed checks in a row that make the server hung (restarted).",
                                             rich_help_panel=SUPERVISION)]
MaxCrashes = Annotated[int, typer.Option(help="Crashes within --crash-window after which buun gives up.",
                                         rich_help_panel=SUPERVISION)]
CrashWindow = Annotated[float, typer.Option(help="Seconds the crash count looks back.", rich_help_panel=SUPERVISION)]
Backoff = Annotated[float, typer.Option(help="Seconds before the first relaunch; doubled per recent crash.",
                                        rich_help_panel=SUPERVISION)]
BackoffMax = Annotated[float, typer.Option(help="Longest wait between relaunches.", rich_help_panel=SUPERVISION)]
StopTimeout = Annotated[float, typer.Option(help="Grace between SIGTERM and SIGKILL.", rich_help_panel=SUPERVISION)]
LogMaxMb = Annotated[float, typer.Option(help="Rotate server.log (and supervisor.log) past this size (MiB).",
                                          rich_help_panel=SUPERVISION)]
LogKeep = Annotated[int, typer.Option(help="Rotated logs to keep.", rich_help_panel=SUPERVISION)]
StallTimeout = Annotated[float, typer.Option(
    help="With --rpc: seconds a request may make no progress, /health answering, before the server is taken for "
    "hung (a worker stopped answering) and restarted; 0 turns it off.", rich_help_panel=SUPERVISION)]

_P = spec_mod.Policy()


@dataclass(frozen=True)
class LaunchOptions:
    """What a launch command was told: recipe and models, address, llama-server flags, policy."""

    recipe: str | None
    name: str | None
    model: Path | None
    draft: Path | None
    models_dir: Path  # resolved once (paths.models_dir)
    host: str
    port: int
    no_api_key: bool
    drops: list[str]
    tree_budget: int | None  # --tree-budget: replaces the recipe's server.tree.budget (settings.with_tree)
    slots: int | None  # --slots: replaces the recipe's server.slots (settings.with_slots)
    gpus: tuple[int, ...] | None  # --gpus: replaces the recipe's server.gpus (server/devices.py)
    draft_gpu: int | None  # --draft-gpu
    rpc: str | None  # --rpc: the RPC workers (spec.with_workers)
    extra: list[str]  # llama-server flags after `--`
    policy: spec_mod.Policy

    def resolve(self, api_key: str | None = None, need_models: bool = True) -> tuple[spec_mod.LaunchSpec, str | None]:
        return spec_mod.resolve(self.recipe, models_dir=self.models_dir, name=self.name, model=self.model,
                                draft=self.draft, host=self.host, port=self.port, extra=self.extra,
                                drops=self.drops, api_key=api_key, no_api_key=self.no_api_key, policy=self.policy,
                                need_models=need_models, tree_budget=self.tree_budget, slots=self.slots,
                                workers=self.rpc, gpus=self.gpus, draft_gpu=self.draft_gpu)


def _bundle(
    ctx: typer.Context, recipe: RecipeArg = None, name: NameOpt = None, model: ModelOpt = None,
    draft: DraftOpt = None, models_dir: ModelsDirOpt = None, host: HostOpt = spec_mod.DEFAULT_HOST,
    port: PortOpt = spec_mod.DEFAULT_PORT, no_api_key: NoKeyOpt = False, drop: DropOpt = None,
    tree_budget: TreeBudgetOpt = None, slots: SlotsOpt = None, gpus: GpusOpt = None, draft_gpu: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    ready_timeout: ReadyTimeout = _P.ready_timeout, health_interval: HealthInterval = _P.health_interval,
    health_timeout: HealthTimeout = _P.health_timeout, health_failures: HealthFailures = _P.health_failures,
    max_crashes: MaxCrashes = _P.max_crashes, crash_window: CrashWindow = _P.crash_window,
    backoff: Backoff = _P.backoff_initial, backoff_max: BackoffMax = _P.backoff_max,
    stop_timeout: StopTimeout = _P.stop_timeout, log_max_mb: LogMaxMb = _P.log_max_bytes / 2**20,
    log_keep: LogKeep = _P.log_keep, stall_timeout: StallTimeout = _P.stall_timeout,
) -> LaunchOptions:
    """The shared options, declared once as these parameters, bundled."""
    recipe, extra = recipe_and_server_flags(recipe, ctx.args)
    _check_supervision({"--ready-timeout": ready_timeout, "--health-interval": health_interval,
                        "--health-timeout": health_timeout, "--health-failures": health_failures,
                        "--max-crashes": max_crashes, "--crash-window": crash_window, "--backoff": backoff,
                        "--backoff-max": backoff_max, "--stop-timeout": stop_timeout, "--log-max-mb": log_max_mb,
                        "--log-keep": log_keep, "--stall-timeout": stall_timeout})
    policy = spec_mod.Policy(ready_timeout, health_interval, health_timeout, health_failures, max_crashes,
                             crash_window, backoff, backoff_max, stop_timeout, int(log_max_mb * 2**20), log_keep,
                             stall_timeout)
    return LaunchOptions(recipe, name, model, draft, paths.models_dir(models_dir), host, port, no_api_key,
                         list(drop or []), tree_budget, slots, devices.parse_gpus(gpus) if gpus else None, draft_gpu,
                         rpc, extra, policy)


def _check_supervision(values: dict[str, float]) -> None:
    """Each supervision option a finite number of 0 or more, named as the command line spells it:
    nan passed every comparison and `--log-max-mb inf` (or nan) was a traceback; Policy.validate,
    which checks the spec's fields, names some of them otherwise (backoff_initial, log_max_bytes)."""
    for option, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{option} {value:g}: expected a finite number of 0 or more",
                             "`buun serve --help` lists the supervision options and their defaults")


_SHARED = list(inspect.signature(_bundle, eval_str=True).parameters.values())


def launch_command(func: Callable[..., None]) -> Callable[..., None]:
    """`func(opts: LaunchOptions, **its own options)` as a typer command taking the shared options."""
    own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]  # after `opts`
    shared_names = [p.name for p in _SHARED]

    @functools.wraps(func)
    def command(**kwargs: Any) -> None:
        opts = _bundle(**{n: kwargs.pop(n) for n in shared_names})
        func(opts, **kwargs)

    params = [*_SHARED, *own]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command

