"""`buun worker start|stop|status|logs`: a supervised ggml-rpc-server on this machine, for a
llama-server elsewhere (`buun serve --rpc HOST:PORT`).

    buun worker start [--port 50052] [--host ADDR] [--threads N] [--device DEV,...] [--cache]
                                          detached, restarted if it crashes; returns once it listens
    buun worker start --host 0.0.0.0 --allow-public "REASON"   a non-private address, on purpose
    buun worker stop [NAME] [--all]       SIGTERM, grace, SIGKILL
    buun worker status [NAME] [--json]    address, pid, uptime, restarts, listening, connected servers
    buun worker logs [NAME] [-f] [-n 50]  ggml-rpc-server's output and the supervisor's events

A worker is named by its port unless --name is given.
"""

from __future__ import annotations

from typing import Annotated

import typer

from buun_tool.base import console
from buun_tool.cli.options import FollowOpt, LinesOpt, duration, show_log, show_statuses, status_header, stop_targets
from buun_tool.cli.options import status_row as row
from buun_tool.server import control
from buun_tool.server import worker as worker_mod
from buun_tool.server.addresses import DEFAULT_PORT

worker_app = typer.Typer(help="Lend this machine's devices to a server elsewhere (RPC worker).", no_args_is_help=True)

NameArg = Annotated[str | None, typer.Argument(help="Worker (its port, or --name; default: the only one).")]


@worker_app.command("start")
def start(
    host: Annotated[str, typer.Option(
        "--host", help="IPv4 address to bind. RPC has no authentication: buun refuses an address beyond loopback, "
        "private and link-local ones (0.0.0.0 included) without --allow-public.")] = worker_mod.DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    name: Annotated[str | None, typer.Option("--name", help="Worker name (default: its port).",
                                             show_default=False)] = None,
    allow_public: Annotated[str | None, typer.Option(
        "--allow-public", metavar="REASON", show_default=False,
        help="Bind a public or wildcard address anyway, saying why (kept in the worker's record and log).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads (ggml-rpc-server's default: 1).",
                                                show_default=False)] = None,
    device: Annotated[str | None, typer.Option(
        "--device", metavar="DEV,...", show_default=False,
        help="Devices to lend, e.g. CUDA0,CUDA1 (default: every GPU, else the CPU). Each is one device of the "
        "server: RPC0, RPC1, ...")] = None,
    cache: Annotated[bool, typer.Option("--cache", help="Keep the tensors it receives in a local file cache, "
                                        "so a relaunched server loads faster.")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Return once it listens (or failed).")] = True,
) -> None:
    """Start a supervised RPC worker in the background (restarted if it crashes)."""
    spec = worker_mod.resolve(host, port, name, allow_public, threads, device, cache)
    console.step(f"starting worker {spec.name} on {spec.url}")
    record = worker_mod.launch(spec, wait=wait, progress=lambda text: console.info(f"    {text}"))
    if record is None:
        console.ok(f"supervisor launched; `buun worker status {spec.name}` shows when it listens")
        return
    console.ok(f"worker {spec.name} listens on {spec.url}; on the server: `buun serve --rpc {_reach(spec)}`")


def _reach(spec: worker_mod.WorkerSpec) -> str:
    return f"{spec.host}:{spec.port}" if spec.host != "0.0.0.0" else f"THIS-MACHINE:{spec.port}"


@worker_app.command("stop")
def stop(
    name: NameArg = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every worker.")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Grace before SIGKILL, in seconds.",
                                                  show_default=False)] = None,
) -> None:
    """Stop a worker: SIGTERM, a grace period, then SIGKILL (a server using it fails its next request).

    With nothing running, there is nothing to do: it says so and succeeds."""
    targets = stop_targets(name, all_, worker_mod.all_workers(), worker_mod.resolve_name)
    if not targets:
        console.ok("no worker is running: nothing to stop")
    for inst in targets:
        console.ok(f"worker {inst.name}: {control.stop(inst, timeout)}")


@worker_app.command("status")
def status(
    name: Annotated[str | None, typer.Argument(help="Worker (default: all).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (one object with NAME, else a list).")] = False,
) -> None:
    """State, address, PID, uptime, restarts, whether it listens and which servers use it."""
    insts = [worker_mod.resolve_name(name)] if name else worker_mod.all_workers()
    show_statuses([worker_mod.status(i) for i in insts], bool(name), json_out, _print,
                  "no workers (start one with `buun worker start`)")


def _print(st: worker_mod.WorkerStatus) -> None:
    r = st.record
    status_header(f"worker {st.name}", st.state.value, " (stale record: see below)" if st.behind else "")
    row("warning", f"stale record, {st.behind}" if st.behind else None)
    row("address", st.address)
    row("pid", f"{st.pid} (supervisor {r.supervisor.pid})" if st.pid and r and r.supervisor else st.pid)
    row("uptime", duration(st.uptime_s))
    if r:
        row("restarts", f"{r.restarts} ({r.crashes} crashes)")
        row("last crash", r.last_crash)
    if st.listening is not None:
        row("listening", "yes" if st.listening else "no (its port is not open)")
    if st.pid:
        row("serving", ", ".join(st.clients) if st.clients else "no server connected")
    row("threads", st.threads)
    row("devices", st.devices)
    if r and r.allow_public:
        row("public", f"binds {r.host} beyond private addresses: {r.allow_public}")
    if r and r.error:
        row("error", r.error.get("message", "").splitlines()[0])
    row("log", r.log if r else None)


@worker_app.command("logs")
def logs(
    name: NameArg = None,
    follow: FollowOpt = False,
    lines: LinesOpt = 50,
) -> None:
    """Show ggml-rpc-server's output and the supervisor's own events."""
    inst = worker_mod.resolve_name(name)
    show_log(inst.log_file, f"worker {inst.name}", lines, follow)


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import SERVER

    app.add_typer(worker_app, name="worker", rich_help_panel=SERVER)
