"""`buun serve`, `start`, `stop`, `restart`, `status`, `logs`, `service`: run llama-server with DFlash.

    buun serve [RECIPE] [--models-dir DIR | --model T.gguf --draft D.gguf] [--port 8080] [-- LLAMA-SERVER FLAGS]
                                          supervise in the foreground (Ctrl-C stops)
    buun serve --host 0.0.0.0 --api-key KEY   other machines may connect (without a key: --no-api-key)
    buun serve --print-cmd [-- -c 4096]   show the llama-server command (secrets masked; models may be missing)
    buun serve --tree-budget 22           verify a DDTree of 22 draft nodes per step (0: the chain)
    buun serve --slots 4                  serve 4 requests at once (each slot a share of -c)
    buun serve --gpus 0,1 [--draft-gpu 0] the target split by layers over cards 0 and 1 (server/devices.py)
    buun serve --rpc 10.0.0.5:50052,...   split the model over RPC workers (`buun worker start` on each)
    buun start [RECIPE] [same options]    the same supervisor, detached; returns once ready
    buun stop [NAME] [--all]              SIGTERM, grace, SIGKILL: no process left behind
    buun restart [NAME] [--models-dir DIR]   relaunch llama-server (a stopped instance: start it again);
                                          with --models-dir, the recipe's models from that folder
    buun status [NAME] [--json]           state, PID, uptime, restarts, health, slots (each one's request and
                                          acceptance), DFlash figures; with --rpc where each part runs and
                                          each worker's connection (a lost one named)
    buun logs [NAME] [-f] [-n 50]         llama-server's output and the supervisor's events
    buun service install [RECIPE] [same options] [--now]   a systemd user unit running this launch

serve, start and service install take the same options (cli/launch.py); serve runs `buun start`'s
launch with the supervisor in the foreground, and a unit runs the launch spec saved at install.

Flags after `--` go to llama-server and replace the recipe's flag of the same option (any of
its spellings: -c / --ctx-size); `--drop FLAG` leaves a recipe flag out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from buun_tool.base import command, console, paths
from buun_tool.base.errors import Exit, UsageError
from buun_tool.cli.launch import ApiKeyOpt, LaunchOptions, launch_command
from buun_tool.cli.options import FollowOpt, LinesOpt, duration, show_log, show_statuses, status_header, stop_targets
from buun_tool.cli.options import status_row as row
from buun_tool.pipeline import build
from buun_tool.plan import devices
from buun_tool.server import control, service
from buun_tool.server import spec as spec_mod
from buun_tool.server.health import SlotRow
from buun_tool.server.instance import Instance, all_instances
from buun_tool.server.settings import API_KEY_ENV
from buun_tool.server.state import State

_EXTRA = {"allow_extra_args": True}


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


def _warn_if_stale(spec: spec_mod.LaunchSpec) -> None:
    """A build the patches (or its flags) moved past still serves, with a line saying so (doctor's check)."""
    warning = build.stale_warning(Path(spec.binary))
    if warning:
        console.warn(warning)


@launch_command
def serve(
    opts: LaunchOptions, api_key: ApiKeyOpt = None,
    print_cmd: Annotated[bool, typer.Option("--print-cmd", help="Print the llama-server command and exit.")] = False,
) -> None:
    """Run llama-server with DFlash in the foreground, restarting it if it crashes (Ctrl-C stops).

    Flags after `--` go to llama-server, replacing the recipe's in any spelling: `buun serve -- -c 4096`.
    `--drop FLAG` leaves a recipe flag out."""
    spec, key = opts.resolve(api_key, need_models=not print_cmd)
    if print_cmd:  # also before the models exist: the command shows the paths they will have
        console.out.print(spec.launch().display(key), markup=False)
        if spec.tuned:
            console.info(f"tuned: {spec.tuned}")
        for problem in spec.missing_files():
            console.warn(f"{problem.message}; {problem.hint}")
        return
    _warn_if_stale(spec)
    control.launch(spec, key, foreground=_printer(spec))  # `buun start`'s path, the supervisor in this process


@launch_command
def start(
    opts: LaunchOptions, api_key: ApiKeyOpt = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Return once ready (or failed).")] = True,
) -> None:
    """Start the supervised server in the background (it keeps running after this command exits).

    Takes the options of `buun serve`, flags after `--` included; returns once the server is ready."""
    spec, key = opts.resolve(api_key)
    _warn_if_stale(spec)
    console.step(f"starting {spec.name} on {spec.url}")
    try:
        record = control.launch(spec, key, wait=wait, progress=lambda text: console.info(f"    {text}"))
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
    """Stop a server: SIGTERM, a grace period, then SIGKILL of its whole process group.

    With nothing running, there is nothing to do: it says so and succeeds."""
    targets = stop_targets(name, all_, all_instances(), control.resolve_name)
    if not targets:
        console.ok("no server instance is running: nothing to stop")
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
    show_statuses([control.status(i, api_key) for i in insts], bool(name), json_out, _print_status,
                  "no server instances (start one with `buun start`)")


def _print_status(st: control.InstanceStatus) -> None:
    r, state = st.record, st.state.value
    status_header(st.name, state, " (stale record: its supervisor is gone)" if st.stale
                  else " (stale record: see below)" if st.behind else "")
    row("warning", f"stale record, {st.behind}" if st.behind else None)
    live = st.state != State.STOPPED
    row("phase", r.phase if r else None)
    row("pid", f"{st.server_pid} (supervisor {r.supervisor.pid})" if st.server_pid and r and r.supervisor
        else st.server_pid)
    if st.orphan:
        row("warning", "llama-server runs without its supervisor: `buun stop` ends it")
    row("uptime", duration(st.uptime_s))
    if r:
        row("restarts", f"{r.restarts} ({r.crashes} crashes)")
        row("last crash", r.last_crash)
        if st.state == State.BACKOFF and r.next_start_at:  # down until then: say so, not only why
            row("relaunch", f"in {max(r.next_start_at - time.time(), 0):.0f} s "
                f"(at {time.strftime('%H:%M:%S', time.localtime(r.next_start_at))})")
        row("recipe", r.recipe)
        row("target", r.target)
        row("draft", r.draft)
    row("endpoint", st.endpoint if live else None)
    row("context", f"{st.context['value']} ({st.context['why']})" if st.context and live else None)
    row("GPUs", devices.describe(st.placement) if st.placement and live else None)
    _print_tuned(st)
    _print_rpc_placement(st)
    probes = st.probes
    row("health", probes.health if probes else None)
    if r and r.unresponsive_since:
        since, allowed = r.unresponsive_since, st.health_failures_allowed
        row("warning", f"unresponsive since {time.strftime('%H:%M:%S', time.localtime(since))} "
            f"({duration(time.time() - since)}, {r.health_fails} failed /health check(s)"
            + (f"; the supervisor relaunches it at {allowed})" if allowed else ")"))
    slots = probes.slots if probes else None
    if slots:
        row("slots", slots.error or f"{slots.total} total"
            + (f", {slots.busy} busy" if slots.busy is not None else "")
            + (f", context {slots.n_ctx} each" if slots.n_ctx else ""))
        for s in slots.per_slot or ():
            row(f"  slot {s.id}", _slot_line(s))
    if probes and probes.dflash_error:
        row("DFlash", probes.dflash_error)
    elif probes and probes.dflash:
        fl = probes.dflash
        rate = f"{fl.acceptance_rate:.1%}" if fl.acceptance_rate is not None else "-"
        al = f"{fl.mean_acceptance_length:.2f}" if fl.mean_acceptance_length is not None else "-"
        row("DFlash", f"{fl.drafts} drafts, {fl.drafted} tokens drafted, {fl.accepted} accepted "
            f"({rate}); mean acceptance length {al}")
    gpu = probes.gpu if probes else None
    if gpu:
        used = ", ".join(f"GPU{g['index']} {g['used_mib']}/{g['total_mib']} MiB" for g in gpu.gpus)
        mine = gpu.server_by_gpu
        each = f" ({', '.join(f'GPU{i} {mib}' for i, mib in mine.items())})" if len(mine) > 1 else ""
        row("GPU", f"llama-server {gpu.server_mib or '?'} MiB{each}; {used}")
    if r and r.error:
        row("error", r.error.get("message", "").splitlines()[0])
    row("log", r.log if r else None)


def _print_tuned(st: control.InstanceStatus) -> None:
    """The tune the launch applied, and a tune that is stale or new since."""
    t = st.tuned
    if not t:
        return
    row("tuned", t["applied"] or "no tune applied")
    if t["stale"] or (t["now"] != t["applied"] and not t["applied"]):
        row("tune now", t["now"])
    if t["serves_ar"]:
        row("drafter", "off: the tune measured AR faster on this card (`buun tune` again, or `-- --spec-type "
            "dflash` to serve DFlash anyway)")


def _print_rpc_placement(st: control.InstanceStatus) -> None:
    """With RPC workers: where the target's layers and the drafter run, each worker's connection,
    and a lost worker with what to do."""
    if not st.rpc_placement:
        return
    where = {d["name"]: d["where"] for d in st.rpc_placement["devices"]}
    row("layers", "split over " + ", ".join(f"{n} ({w})" for n, w in where.items()) + ", in this order")
    dev = st.rpc_placement.get("draft_device")
    if dev:
        row("drafter", f"on {dev}" + (f" ({where[dev]})" if dev in where else "")
            + (f": {st.rpc_placement['why']}" if st.rpc_placement.get("why") else ""))
    for w in st.workers or []:
        state = w.connection or "(llama-server is not running)"
        if w.lost:
            since = time.strftime("%H:%M:%S", time.localtime(w.lost_since)) if w.lost_since else "?"
            state = f"LOST since {since} ({w.lost}): {w.next_step}"
        row("worker", f"{w.address} ({', '.join(w.devices) or '?'}): {state}")


def _slot_line(s: SlotRow) -> str:
    """`busy: task 12, 1840 tokens in context, 230 generated at 41.2 tok/s, 71% of drafts accepted (AL 7.4)`."""
    if s.task is None:
        return "idle, unused"
    state = "busy" if s.busy else "idle, last"
    parts = [f"{state}: task {s.task}"]
    if s.context_tokens is not None:
        parts.append(f"{s.context_tokens} tokens in context")
    if s.generated is not None:
        speed = f" at {s.tokens_per_second:.1f} tok/s" if s.tokens_per_second else ""
        parts.append(f"{s.generated} generated{speed}")
    if s.acceptance_rate is not None:
        al = f" (AL {s.mean_acceptance_length:.2f})" if s.mean_acceptance_length else ""
        parts.append(f"{s.acceptance_rate:.0%} of {s.drafted} drafted accepted{al}")
    return ", ".join(parts)


def logs(
    name: Annotated[str | None, typer.Argument(help="Instance (default: the only one running).")] = None,
    follow: FollowOpt = False,
    lines: LinesOpt = 50,
) -> None:
    """Show llama-server's output and the supervisor's own events."""
    inst = control.resolve_name(name)
    show_log(inst.log_file, f"instance {inst.name}", lines, follow)


service_app = typer.Typer(help="Run the server as a systemd user service.", no_args_is_help=True)


@service_app.command("install", context_settings=_EXTRA)
@launch_command
def service_install(
    opts: LaunchOptions,
    now: Annotated[bool, typer.Option("--now", help="Also enable and start it (systemctl --user).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a unit with other settings.")] = False,
) -> None:
    """Write a systemd user unit that runs this launch, as resolved now (started only with --now).

    The unit runs the saved launch spec, not these options: re-run it after changing the recipe or
    the models. For an API key, pass `-- --api-key-file FILE`: the key itself is never saved."""
    in_args = command.take_secrets(command.parse_args(opts.extra))[1]
    if in_args:
        raise UsageError(f"{', '.join(in_args)} after `--` cannot reach the unit: it keeps no secret",
                         "put an API key in a file (mode 600) and pass `-- --api-key-file FILE`")
    if os.environ.get(API_KEY_ENV):
        console.warn(f"the unit does not get {API_KEY_ENV}; for an API key pass `-- --api-key-file FILE`")
    spec, key = opts.resolve()
    if key:  # the recipe's --api-key: the unit would serve without it (or, beyond loopback, never start)
        raise UsageError(f"the recipe {spec.recipe_source} sets --api-key, which cannot reach the unit: "
                         "it keeps no secret",
                         "put the key in a file (mode 600) and pass `-- --api-key-file FILE` "
                         "(`--drop --api-key` leaves the recipe's out)")
    spec_mod.check_exposure(spec, None)  # the unit's key is an --api-key-file among the flags, if any
    spec.check_files()
    path = service.install(spec, force)
    console.ok(f"wrote {path} (it runs the launch saved in {Instance(spec.name).service_spec_file})")
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
    from buun_tool.cli.options import SERVER

    app.command(rich_help_panel=SERVER, context_settings=_EXTRA)(serve)
    app.command(rich_help_panel=SERVER, context_settings=_EXTRA)(start)
    app.command(rich_help_panel=SERVER)(stop)
    app.command(rich_help_panel=SERVER)(restart)
    app.command(rich_help_panel=SERVER)(status)
    app.command(rich_help_panel=SERVER)(logs)
    app.add_typer(service_app, name="service", rich_help_panel=SERVER)
