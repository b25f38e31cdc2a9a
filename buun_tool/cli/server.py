"""`buun serve`, `start`, `stop`, `restart`, `status`, `logs`, `service`: run llama-server with DFlash.

    buun serve [RECIPE] [--models-dir DIR | --model T.gguf --draft D.gguf] [--port 8080] [-- LLAMA-SERVER FLAGS]
                                          supervise in the foreground (Ctrl-C stops)
    buun serve --host 0.0.0.0 --api-key KEY   other machines may connect (without a key: --no-api-key)
    buun serve --print-cmd [-- -c 4096]   show the llama-server command (secrets masked; models may be missing)
    buun start [RECIPE] [same options]    the same supervisor, detached; returns once ready
    buun stop [NAME] [--all]              SIGTERM, grace, SIGKILL: no process left behind
    buun restart [NAME] [--models-dir DIR]   relaunch llama-server (a stopped instance: start it again);
                                          with --models-dir, the recipe's models from that folder
    buun status [NAME] [--json]           state, PID, uptime, restarts, health, slots, DFlash figures
    buun logs [NAME] [-f] [-n 50]         llama-server's output and the supervisor's events
    buun service install [RECIPE] [same options] [--now]   a systemd user unit running `buun serve`

Flags after `--` go to llama-server and replace the recipe's flag of the same option (any of
its spellings: -c / --ctx-size); `--drop FLAG` leaves a recipe flag out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from buun_tool import console, paths
from buun_tool.cli.options import ModelsDirOpt
from buun_tool.errors import Exit, UsageError
from buun_tool.server import command, control, logfile, service
from buun_tool.server import spec as spec_mod
from buun_tool.server.instance import Instance, all_instances
from buun_tool.server.supervisor import Supervisor

SUPERVISION = "Supervision"
_EXTRA = {"allow_extra_args": True}

# Options shared by serve, start and service install, defined once.
RecipeArg = Annotated[str | None, typer.Argument(help="Recipe name or YAML file (default: qwen3.5-27b-dflash).",
                                                 show_default=False)]
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
    "--api-key", envvar=spec_mod.API_KEY_ENV, show_envvar=True, show_default=False,
    help="API key clients must send; handed to llama-server via LLAMA_API_KEY, never stored or shown.")]
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
LogMaxMb = Annotated[float, typer.Option(help="Rotate server.log past this size (MiB).", rich_help_panel=SUPERVISION)]
LogKeep = Annotated[int, typer.Option(help="Rotated logs to keep.", rich_help_panel=SUPERVISION)]

_P = spec_mod.Policy()


def _policy(ready_timeout: float, health_interval: float, health_timeout: float, health_failures: int,
            max_crashes: int, crash_window: float, backoff: float, backoff_max: float, stop_timeout: float,
            log_max_mb: float, log_keep: int) -> spec_mod.Policy:
    return spec_mod.Policy(ready_timeout, health_interval, health_timeout, health_failures, max_crashes,
                           crash_window, backoff, backoff_max, stop_timeout, int(log_max_mb * 2**20), log_keep)


def _split_extra(ctx: typer.Context, recipe: str | None) -> tuple[str | None, list[str]]:
    """After `--` click hands the first word to RECIPE; a recipe never starts with '-'."""
    if recipe is not None and recipe.startswith("-"):
        return None, [recipe, *ctx.args]
    return recipe, list(ctx.args)


def _printer(spec: spec_mod.LaunchSpec):
    def show(kind: str, message: str) -> None:
        if kind == "phase":
            console.info(f"    {message}")
        elif kind == "starting":
            console.step(message)
        elif kind == "ready":
            console.ok(f"ready: {spec.url}  (web chat: {spec.url}/  OpenAI API: {spec.url}/v1)")
        elif kind == "backoff":
            console.warn(message)
        elif kind in ("stopping", "stopped"):
            console.info(f"{kind}: {message}")
    return show


def serve(
    ctx: typer.Context, recipe: RecipeArg = None, name: NameOpt = None, model: ModelOpt = None,
    draft: DraftOpt = None, models_dir: ModelsDirOpt = None, host: HostOpt = spec_mod.DEFAULT_HOST,
    port: PortOpt = spec_mod.DEFAULT_PORT, api_key: ApiKeyOpt = None, no_api_key: NoKeyOpt = False,
    drop: DropOpt = None,
    print_cmd: Annotated[bool, typer.Option("--print-cmd", help="Print the llama-server command and exit.")] = False,
    ready_timeout: ReadyTimeout = _P.ready_timeout, health_interval: HealthInterval = _P.health_interval,
    health_timeout: HealthTimeout = _P.health_timeout, health_failures: HealthFailures = _P.health_failures,
    max_crashes: MaxCrashes = _P.max_crashes, crash_window: CrashWindow = _P.crash_window,
    backoff: Backoff = _P.backoff_initial, backoff_max: BackoffMax = _P.backoff_max,
    stop_timeout: StopTimeout = _P.stop_timeout, log_max_mb: LogMaxMb = _P.log_max_bytes / 2**20,
    log_keep: LogKeep = _P.log_keep,
) -> None:
    """Run llama-server with DFlash in the foreground, restarting it if it crashes (Ctrl-C stops).

    Flags after `--` go to llama-server, replacing the recipe's in any spelling: `buun serve -- -c 4096`.
    `--drop FLAG` leaves a recipe flag out."""
    recipe, extra = _split_extra(ctx, recipe)
    models = paths.models_dir(models_dir)
    policy = _policy(ready_timeout, health_interval, health_timeout, health_failures, max_crashes, crash_window,
                     backoff, backoff_max, stop_timeout, log_max_mb, log_keep)
    spec, key = spec_mod.resolve(recipe, models_dir=models, name=name, model=model, draft=draft, host=host,
                                 port=port, extra=extra, drops=drop, api_key=api_key, no_api_key=no_api_key,
                                 policy=policy, need_models=not print_cmd)
    if print_cmd:  # also before the models exist: the command shows the paths they will have
        console.out.print(command.display(spec.argv, key), markup=False)
        for problem in spec.missing_files():
            console.warn(f"{problem.message}; {problem.hint}")
        return
    spec_mod.check_exposure(spec, key)
    spec.check_files()
    inst = Instance(spec.name)
    fd = inst.try_lock()
    if fd is None:
        raise control.busy_error(inst)
    try:
        control.check_port(spec)
        inst.write_spec(spec.to_json())
        Supervisor(spec, inst, key, _printer(spec)).run()
    finally:
        os.close(fd)


def start(
    ctx: typer.Context, recipe: RecipeArg = None, name: NameOpt = None, model: ModelOpt = None,
    draft: DraftOpt = None, models_dir: ModelsDirOpt = None, host: HostOpt = spec_mod.DEFAULT_HOST,
    port: PortOpt = spec_mod.DEFAULT_PORT, api_key: ApiKeyOpt = None, no_api_key: NoKeyOpt = False,
    drop: DropOpt = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Return once ready (or failed).")] = True,
    ready_timeout: ReadyTimeout = _P.ready_timeout, health_interval: HealthInterval = _P.health_interval,
    health_timeout: HealthTimeout = _P.health_timeout, health_failures: HealthFailures = _P.health_failures,
    max_crashes: MaxCrashes = _P.max_crashes, crash_window: CrashWindow = _P.crash_window,
    backoff: Backoff = _P.backoff_initial, backoff_max: BackoffMax = _P.backoff_max,
    stop_timeout: StopTimeout = _P.stop_timeout, log_max_mb: LogMaxMb = _P.log_max_bytes / 2**20,
    log_keep: LogKeep = _P.log_keep,
) -> None:
    """Start the supervised server in the background (it keeps running after this command exits).

    Takes the options of `buun serve`, flags after `--` included; returns once the server is ready."""
    recipe, extra = _split_extra(ctx, recipe)
    models = paths.models_dir(models_dir)
    policy = _policy(ready_timeout, health_interval, health_timeout, health_failures, max_crashes, crash_window,
                     backoff, backoff_max, stop_timeout, log_max_mb, log_keep)
    spec, key = spec_mod.resolve(recipe, models_dir=models, name=name, model=model, draft=draft, host=host,
                                 port=port, extra=extra, drops=drop, api_key=api_key, no_api_key=no_api_key,
                                 policy=policy)
    spec_mod.check_exposure(spec, key)
    spec.check_files()
    console.step(f"starting {spec.name} on {spec.url}")
    try:
        record = control.start_detached(spec, key, wait, lambda text: console.info(f"    {text}"))
    except KeyboardInterrupt:
        console.warn(f"stopped waiting; {spec.name} keeps starting in the background "
                     f"(`buun status {spec.name}`, `buun stop {spec.name}`)")
        raise typer.Exit(int(Exit.INTERRUPTED)) from None
    if record is None:
        console.ok(f"supervisor launched; `buun status {spec.name}` shows when it is ready")
    else:
        console.ok(f"{spec.name} is ready: {spec.url}  (web chat: {spec.url}/  OpenAI API: {spec.url}/v1)")


def stop(
    name: Annotated[str | None, typer.Argument(help="Instance (default: the only one running).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every instance.")] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Grace before SIGKILL, in seconds (default: the instance's --stop-timeout).",
        show_default=False)] = None,
) -> None:
    """Stop a server: SIGTERM, a grace period, then SIGKILL of its whole process group."""
    targets = all_instances() if all_ else [control.resolve_name(name)]
    for inst in targets:
        console.ok(f"{inst.name}: {control.stop(inst, timeout)}")


def restart(
    name: Annotated[str | None, typer.Argument(help="Instance (default: the only one running).")] = None,
    api_key: ApiKeyOpt = None,
    models_dir: Annotated[Path | None, typer.Option(
        "--models-dir", show_default=False,
        help="Take the recipe's models from this folder instead of the one the instance was started with.")
    ] = None,
) -> None:
    """Relaunch llama-server with the same settings (a stopped instance is started again)."""
    inst = control.resolve_name(name)
    # unlike the other commands, no default: without the option the saved launch keeps its folder
    folder = paths.models_dir(models_dir) if models_dir else None
    r = control.restart(inst, api_key, lambda text: console.info(f"    {text}"), models_dir=folder)
    console.ok(f"{inst.name} is ready again (llama-server pid {r.server.pid if r.server else '?'})")


def status(
    name: Annotated[str | None, typer.Argument(help="Instance (default: all).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (one object with NAME, else a list).")] = False,
    api_key: ApiKeyOpt = None,
) -> None:
    """State, PID, uptime, restarts, endpoint, health, slots, DFlash acceptance and GPU memory."""
    insts = [control.resolve_name(name)] if name else all_instances()
    data = [control.status(i, api_key) for i in insts]
    if json_out:
        console.print_json(data[0] if name else data)
        return
    if not data:
        console.info("no server instances (start one with `buun start`)")
    for d in data:
        _print_status(d)


_STATE_STYLE = {"ready": "green", "starting": "cyan", "backoff": "yellow", "stopping": "yellow",
                "failed": "red", "stopped": "dim"}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 86400}d{s % 86400 // 3600:02d}h" if s >= 86400 else (
        f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s")


def _print_status(d: dict[str, Any]) -> None:
    out = console.out
    state = d["state"]
    extra = " (stale record: its supervisor is gone)" if d.get("stale") else ""
    out.print(f"[bold]{d['name']}[/]  [{_STATE_STYLE.get(state, 'white')}]{state}[/]{extra}")

    def row(label: str, value: Any) -> None:
        if value not in (None, "", []):
            out.print(f"  {label:<10} {value}", markup=False)

    if d.get("phase"):
        row("phase", d["phase"])
    row("pid", f"{d['server_pid']} (supervisor {d['supervisor']['pid']})"
        if d.get("server_pid") and d.get("supervisor") else d.get("server_pid"))
    if d.get("orphan"):
        row("warning", "llama-server runs without its supervisor: `buun stop` ends it")
    row("uptime", _duration(d.get("uptime_s")) if d.get("uptime_s") is not None else None)
    row("restarts", f"{d.get('restarts', 0)} ({d.get('crashes', 0)} crashes)" if "restarts" in d else None)
    row("last crash", d.get("last_crash"))
    row("recipe", d.get("recipe"))
    files = d.get("model_files") or {}
    row("target", files.get("target"))
    row("draft", files.get("draft"))
    row("endpoint", d.get("endpoint") if state != "stopped" else None)
    context = d.get("context")
    row("context", f"{context['value']} ({context['why']})" if context and state != "stopped" else None)
    row("health", d.get("health"))
    if d.get("unresponsive_since"):
        since = d["unresponsive_since"]
        allowed = d.get("health_failures_allowed")
        row("warning", f"unresponsive since {time.strftime('%H:%M:%S', time.localtime(since))} "
            f"({_duration(time.time() - since)}, {d.get('health_fails', 0)} failed /health check(s)"
            + (f"; the supervisor relaunches it at {allowed})" if allowed else ")"))
    slots = d.get("slots")
    if slots:
        row("slots", slots.get("error") or f"{slots.get('total')} total"
            + (f", {slots['busy']} busy" if slots.get("busy") is not None else "")
            + (f", context {slots['n_ctx']} each" if slots.get("n_ctx") else ""))
    fl = d.get("dflash")
    if fl:
        if fl.get("error"):
            row("DFlash", fl["error"])
        else:
            rate = f"{fl['acceptance_rate']:.1%}" if fl.get("acceptance_rate") is not None else "-"
            al = f"{fl['mean_acceptance_length']:.2f}" if fl.get("mean_acceptance_length") is not None else "-"
            row("DFlash", f"{fl['drafts']} drafts, {fl['drafted']} tokens drafted, {fl['accepted']} accepted "
                f"({rate}); mean acceptance length {al}")
    gpu = d.get("gpu")
    if gpu:
        used = ", ".join(f"GPU{g['index']} {g['used_mib']}/{g['total_mib']} MiB" for g in gpu.get("gpus", []))
        row("GPU", f"llama-server {gpu.get('server_mib') or '?'} MiB; {used}")
    if d.get("error"):
        row("error", d["error"].get("message", "").splitlines()[0])
    row("log", d.get("log"))


def logs(
    name: Annotated[str | None, typer.Argument(help="Instance (default: the only one running).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines to show.")] = 50,
) -> None:
    """Show llama-server's output and the supervisor's own events."""
    inst = control.resolve_name(name)
    if not inst.log_file.exists() and not follow:
        raise UsageError(f"instance {inst.name} has no log yet ({inst.log_file})")
    for line in logfile.tail(inst.log_file, lines):
        console.out.print(line, markup=False, highlight=False)
    if follow:
        try:
            for line in logfile.follow(inst.log_file):
                console.out.print(line, markup=False, highlight=False)
        except KeyboardInterrupt:
            pass


service_app = typer.Typer(help="Run the server as a systemd user service.", no_args_is_help=True)


@service_app.command("install", context_settings=_EXTRA)
def service_install(
    ctx: typer.Context, recipe: RecipeArg = None, name: NameOpt = None, model: ModelOpt = None,
    draft: DraftOpt = None, models_dir: ModelsDirOpt = None, host: HostOpt = spec_mod.DEFAULT_HOST,
    port: PortOpt = spec_mod.DEFAULT_PORT, no_api_key: NoKeyOpt = False, drop: DropOpt = None,
    now: Annotated[bool, typer.Option("--now", help="Also enable and start it (systemctl --user).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a unit with other settings.")] = False,
    ready_timeout: ReadyTimeout = _P.ready_timeout, health_interval: HealthInterval = _P.health_interval,
    health_timeout: HealthTimeout = _P.health_timeout, health_failures: HealthFailures = _P.health_failures,
    max_crashes: MaxCrashes = _P.max_crashes, crash_window: CrashWindow = _P.crash_window,
    backoff: Backoff = _P.backoff_initial, backoff_max: BackoffMax = _P.backoff_max,
    stop_timeout: StopTimeout = _P.stop_timeout, log_max_mb: LogMaxMb = _P.log_max_bytes / 2**20,
    log_keep: LogKeep = _P.log_keep,
) -> None:
    """Write a systemd user unit that runs `buun serve` with these settings (started only with --now).
    For an API key, pass `-- --api-key-file FILE`: the key itself is never written into the unit."""
    recipe, extra = _split_extra(ctx, recipe)
    models = paths.models_dir(models_dir)
    policy = _policy(ready_timeout, health_interval, health_timeout, health_failures, max_crashes, crash_window,
                     backoff, backoff_max, stop_timeout, log_max_mb, log_keep)
    in_args = command.take_secrets(command.parse_args(extra))[1]
    if in_args:
        raise UsageError(f"{', '.join(in_args)} after `--` would be written into the unit file in clear",
                         "put an API key in a file (mode 600) and pass `-- --api-key-file FILE`")
    if os.environ.get(spec_mod.API_KEY_ENV):
        console.warn(f"the unit does not get {spec_mod.API_KEY_ENV}; for an API key pass `-- --api-key-file FILE`")
    # the key the unit's `buun serve` will have: only the recipe's (it reads the recipe again)
    spec, key = spec_mod.resolve(recipe, models_dir=models, name=name, model=model, draft=draft, host=host,
                                 port=port, extra=extra, drops=drop, no_api_key=no_api_key, policy=policy)
    spec_mod.check_exposure(spec, key)
    args = [recipe or spec.recipe, "--name", spec.name, "--host", host, "--port", str(port)]
    if no_api_key:
        args.append("--no-api-key")
    if model:
        args += ["--model", spec.target]
    if draft:
        args += ["--draft", spec.draft]
    if not (model and draft):  # the recipe's models, from the folder resolved here (not the unit's environment)
        args += ["--models-dir", str(models)]
    for d in drop or []:
        args.append(f"--drop={d}")
    for field_name, value in vars(policy).items():
        if value != getattr(_P, field_name):
            opt = {"backoff_initial": "backoff", "log_max_bytes": "log_max_mb"}.get(field_name, field_name)
            shown = value / 2**20 if field_name == "log_max_bytes" else value
            args += [f"--{opt.replace('_', '-')}", f"{shown:g}"]
    if extra:
        args += ["--", *extra]
    path = service.install(spec.name, args, policy.stop_timeout, force)
    console.ok(f"wrote {path}")
    if now:
        service.enable_now(spec.name)
        console.ok(f"started {service.unit_name(spec.name)}; `buun status {spec.name}` shows it")
    else:
        console.info(f"start it with: systemctl --user enable --now {service.unit_name(spec.name)}")


@service_app.command("uninstall")
def service_uninstall(name: Annotated[str, typer.Argument(help="Instance name of the unit.")]) -> None:
    """Disable, stop and remove the unit of an instance."""
    path = service.uninstall(name)
    if path is None:
        raise UsageError(f"no unit for {name} in {service.unit_dir()}")
    console.ok(f"removed {path}")


def register(app: typer.Typer) -> None:
    from buun_tool.cli.app import SERVER

    app.command(rich_help_panel=SERVER, context_settings=_EXTRA)(serve)
    app.command(rich_help_panel=SERVER, context_settings=_EXTRA)(start)
    app.command(rich_help_panel=SERVER)(stop)
    app.command(rich_help_panel=SERVER)(restart)
    app.command(rich_help_panel=SERVER)(status)
    app.command(rich_help_panel=SERVER)(logs)
    app.add_typer(service_app, name="service", rich_help_panel=SERVER)
