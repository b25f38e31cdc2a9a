"""What the server commands do, below the CLI: launch an instance (its supervisor in the
foreground or detached), stop, restart, and gather an instance's status (a typed record).

Whoever holds an instance's lock owns its state record: the supervisor while it lives, and
`stop` when it cleans up after a supervisor that died. `launch` takes the lock *before* anything
starts and hands the locked fd down to a detached supervisor, so two launches cannot both run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

import buun_tool
from buun_tool.base import nvidia
from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.base.fsutil import open_private
from buun_tool.server import addresses, logfile, metrics, process, record_lag, rpc, tuned
from buun_tool.server.health import NEEDS_KEY, Probe, SlotsRow, slots_summary
from buun_tool.server.instance import Instance, all_instances, live, pick
from buun_tool.server.metrics import DFlashStats
from buun_tool.server.settings import API_KEY_ENV
from buun_tool.server.spec import LaunchSpec, check_exposure, with_models_dir
from buun_tool.server.state import Record, State
from buun_tool.server.supervise import Listener, Supervisor

Progress = Callable[[str], None]
# Each of `buun status`'s HTTP probes; they run at once, so a hung server answers within ~2 s.
STATUS_PROBE_TIMEOUT_S = 0.8


class AlreadyRunning(BuunError):
    exit_code = Exit.CONFLICT


def busy_error(inst: Instance) -> AlreadyRunning:
    r = inst.read()
    if r and r.state.running:
        where = f" on {r.host}:{r.port}" if r.port else ""
        pid = f", supervisor pid {r.supervisor.pid}" if r.supervisor else ""
        return AlreadyRunning(f"{_kind(inst)} {inst.name} is already running ({r.state.value}{where}{pid})",
                              f"`{inst.command('stop')}` first, or start another with --name NAME --port N")
    return AlreadyRunning(f"{_kind(inst)} {inst.name} is already being started or stopped by another buun",
                          f"`{inst.command('status')}` shows it")


def claim(inst: Instance) -> tuple[int, int]:
    """The instance's lock and its guard (fds), for a launch; AlreadyRunning when a supervisor holds
    either: the guard alone when the lock file was made anew while that supervisor runs (instance.py)."""
    fd = inst.try_lock()
    if fd is None:
        raise busy_error(inst)
    guard = inst.take_guard()
    if guard is None:
        os.close(fd)
        raise AlreadyRunning(f"{_kind(inst)} {inst.name} is already running: its supervisor lives on, though its lock "
                             "file was deleted", f"it makes its files again within seconds: `{inst.command('status')}` "
                             f"shows it, `{inst.command('stop')}` stops it")
    return fd, guard


def _kind(inst: Instance) -> str:
    return "instance" if inst.program == "llama-server" else "worker"


def check_port(spec: LaunchSpec) -> None:
    if not process.is_local_address(spec.host):  # port_free would say "in use by another program"
        raise UsageError(f"--host {spec.host} is not an address of this machine",
                         "bind one of its own (`ip -4 addr` lists them), 127.0.0.1, or 0.0.0.0 for all of them")
    if not process.port_free(spec.host, spec.port):
        holder = process.port_holder(spec.port)
        owner = _instance_on_port(spec.port, holder.pid if holder else None)
        who = (f"buun instance {owner}" if owner else holder.describe() if holder else "another program")
        raise BuunError(f"port {spec.port} on {spec.host} is in use by {who}",
                        f"pass --port N for a free port{f', or `buun stop {owner}`' if owner else ''}",
                        Exit.CONFLICT)


def _instance_on_port(port: int, pid: int | None) -> str | None:
    for inst in all_instances():
        r = inst.read()
        if r and r.port == port and r.state.running and (pid is None or (r.server and r.server.pid == pid)):
            return inst.name
    return None


# --- start -----------------------------------------------------------------------------------

def launch(spec: LaunchSpec, api_key: str | None, *, foreground: Listener | None = None, wait: bool = True,
           progress: Progress | None = None) -> Record | None:
    """Start an instance, the one way every command does: the launch's checks, the instance lock
    (taken before anything starts, so two launches cannot both run) and the saved spec; then the
    supervisor, in this process with `foreground` (`buun serve`, the systemd unit: returns when
    it stops) or detached (`buun start`, restart, setup: with `wait`, returns once the server is
    ready, or raises the cause it failed with)."""
    check_exposure(spec, api_key)
    spec.check_files()
    inst = Instance(spec.name)
    new = not inst.dir.exists()
    fd, guard = claim(inst)
    try:
        try:
            check_port(spec)
        except BuunError:
            if new:  # refused before anything ran: no instance is left that `buun status` would list
                shutil.rmtree(inst.dir, ignore_errors=True)
            raise
        spec.keyed = bool(api_key)
        inst.write_spec(spec.to_json())
        if foreground is not None:
            Supervisor(spec, inst, api_key, foreground, fd).run()
            return inst.read()
        sup = _spawn_supervisor(spec, inst, api_key, fd, guard)
    finally:
        os.close(fd)  # a detached supervisor holds the lock and the guard through its own copies
        os.close(guard)
    return wait_for(inst, spec.run_id, sup, progress) if wait else None


def _spawn_supervisor(spec: LaunchSpec, inst: Instance, api_key: str | None, fd: int,
                      guard: int) -> subprocess.Popen[bytes]:
    """`python -m buun_tool.server.supervisor NAME --lock-fd FD --guard-fd FD` in a session of its own."""
    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = api_key
    return spawn_detached("buun_tool.server.supervisor", inst, fd, guard, env)


def spawn_detached(module: str, inst: Instance, fd: int, guard: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`python -m MODULE NAME --lock-fd FD --guard-fd FD` in a session of its own, its output in
    the instance's supervisor.log: a supervisor that outlives the command that started it."""
    pkg_root = str(Path(buun_tool.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    with open_private(inst.supervisor_log) as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, inst.name, "--lock-fd", str(fd), "--guard-fd", str(guard)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            pass_fds=(fd, guard), start_new_session=True, cwd=pkg_root,
        )


def wait_for(inst: Instance, run_id: str, sup: subprocess.Popen[bytes] | psutil.Process | None,
             progress: Progress | None = None, server_not: int | None = None) -> Record:
    """Until the instance is ready (with a server other than `server_not`), or failed."""
    shown = ""
    while True:
        gone = _gone(sup)  # before reading: a supervisor writes its last record, then exits
        r = inst.read()
        if r is not None and r.run_id == run_id:
            if r.state == State.READY and (server_not is None or (r.server and r.server.pid != server_not)):
                return r
            if r.state in (State.FAILED, State.STOPPED):  # final: the supervisor exits right after
                _wait_gone(sup, 5.0)  # so that the command returns with no process of it left
            if r.state == State.FAILED:
                err = r.error or {}
                raise BuunError(err.get("message", "the server failed"), err.get("hint"),
                                Exit(err.get("exit_code", Exit.FAILED)))
            if r.state == State.STOPPED:
                raise BuunError(f"instance {inst.name} was stopped while starting")
            text = r.phase if r.state == State.STARTING else f"{r.state.value}: {r.last_crash}"
            if progress and text and text != shown:
                progress(text)
                shown = text
        if gone:
            tail = "\n    ".join(logfile.tail(inst.supervisor_log, 15))
            raise BuunError(f"the supervisor of {inst.name} exited before {inst.program} was ready:\n    {tail}",
                            f"see {inst.supervisor_log} and `{inst.command('logs')}`")
        time.sleep(0.1)


def _wait_gone(sup: subprocess.Popen[bytes] | psutil.Process | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sup is not None and not _gone(sup) and time.monotonic() < deadline:
        time.sleep(0.05)


def _gone(sup: subprocess.Popen[bytes] | psutil.Process | None) -> bool:
    if sup is None:
        return False
    if isinstance(sup, subprocess.Popen):
        return sup.poll() is not None
    try:
        return not sup.is_running() or sup.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- stop ------------------------------------------------------------------------------------

def stop(inst: Instance, grace: float | None = None) -> str:
    """Stop an instance and leave no process behind. Returns what happened, for the user."""
    grace = grace if grace is not None else (_policy_stop_timeout(inst) or 15.0)
    killed = False
    if inst.is_locked():
        sup = _locking_supervisor(inst)
        if sup is not None:
            sup.send_signal(signal.SIGTERM)  # the loop stops the server in order, then exits
            if _wait_unlocked(inst, grace + 3.0):
                return "stopped"
            process.kill_process(sup, 0.0)  # it already had its SIGTERM: kill it, then its server below
            killed = True
        elif inst.is_locked():  # a start still spawning it, or a stop cleaning up, for more than 5 s
            raise BuunError(f"instance {inst.name} is held by another buun command (a start or a stop) and "
                            "names no supervisor yet", f"retry in a moment; `{inst.command('status')}` shows it",
                            Exit.CONFLICT)
        # else another stop (or a start that failed) held it for a moment and let go: see what it left
    with inst.locked():  # no supervisor: the record is ours to fix
        r = inst.read()
        server = live(r.server if r else None, inst.program)
        if server is not None:  # orphaned (the supervisor died before it could stop it)
            process.stop_group(server.pid, grace)  # launched as a session leader: pgid == pid
        if r is None:
            return "not running"
        if not (r.state.running or server is not None):
            return f"not running ({r.state.value})"
        r.state, r.server, r.phase = State.STOPPED, None, ""
        inst.write(r)
        if killed:
            return f"stopped (its supervisor did not answer SIGTERM within {grace + 3:g} s and was killed)"
        return "stopped (cleaned up after a supervisor that had died)"


def _locking_supervisor(inst: Instance, wait: float = 5.0) -> psutil.Process | None:
    """The live supervisor named by the record; a start in progress gets `wait` s to write it."""
    deadline = time.monotonic() + wait
    while True:
        r = inst.read()
        sup = live(r.supervisor if r else None)
        if sup is not None or not inst.is_locked() or time.monotonic() >= deadline:
            return sup
        time.sleep(0.05)


def _wait_unlocked(inst: Instance, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not inst.is_locked():
            return True
        time.sleep(0.05)
    return False


def _policy_stop_timeout(inst: Instance) -> float | None:
    data = inst.read_spec() or {}
    return (data.get("policy") or {}).get("stop_timeout")


# --- restart ---------------------------------------------------------------------------------

def restart(inst: Instance, api_key: str | None, progress: Progress | None = None,
            models_dir: Path | None = None) -> Record:
    """A live supervisor relaunches its server in place (SIGHUP: it keeps running under systemd
    or a terminal); otherwise the saved spec is started again, detached. With `models_dir`, the
    recipe's models come from that folder: a launch of its own, so a live supervisor is stopped
    first and the spec saved with the new paths."""
    sup = _locking_supervisor(inst) if inst.is_locked() else None
    r = inst.read()
    data = inst.read_spec()
    spec = LaunchSpec.from_json(data) if data is not None else None
    if spec is not None and models_dir is not None and spec.models_dir != str(models_dir):
        spec = with_models_dir(spec, models_dir)  # other files: a launch of its own, not a relaunch in place
    elif sup is not None and r is not None:
        old = r.server.pid if r.server else None
        sup.send_signal(signal.SIGHUP)
        return wait_for(inst, r.run_id, sup, progress, server_not=old)
    if spec is None:
        raise UsageError(f"instance {inst.name} has never been started", "use `buun start` first")
    key = api_key or os.environ.get(API_KEY_ENV)
    if spec.keyed and not key:  # else a server started with a key came back without one, on loopback silently
        raise UsageError(f"{inst.name} was started with an API key, which buun does not store",
                         "pass --api-key KEY (or set BUUN_API_KEY) to `buun restart`")
    check_exposure(spec, key)  # both before a running server is stopped for a launch that cannot start
    spec.check_files()
    if sup is not None:
        stop(inst)
    spec.run_id = os.urandom(16).hex()
    result = launch(spec, key, progress=progress)
    assert result is not None
    return result


# --- status ----------------------------------------------------------------------------------

@dataclass
class Probes:
    """What the running server answered, each probe at once with a short timeout."""

    health: str | None
    slots: SlotsRow | None
    dflash: DFlashStats | None
    gpu: nvidia.ServerMemory | None
    timeout_s: float = STATUS_PROBE_TIMEOUT_S
    dflash_error: str | None = None  # why /metrics gave no figures (the API key)

    def to_json(self) -> dict[str, Any]:
        return {"health": self.health, "slots": self.slots.to_json() if self.slots else None,
                "dflash": {"error": self.dflash_error} if self.dflash_error
                else self.dflash.to_json() if self.dflash else None,
                "gpu": self.gpu.to_json() if self.gpu else None, "probe_timeout_s": self.timeout_s}


@dataclass
class InstanceStatus:
    """What `buun status` shows of one instance; `to_json()` is its `--json` object (the record's
    fields, then these)."""

    name: str
    state: State
    running: bool  # a supervisor holds the instance lock
    record: Record | None = None  # the supervisor's last record
    stale: bool = False  # the record says running, but no supervisor holds the lock
    behind: str | None = None  # why the live supervisor's record is older than what it does (record_lag.lag)
    server_pid: int | None = None
    orphan: bool = False  # llama-server lives on without its supervisor: `buun stop` ends it
    uptime_s: float | None = None  # this llama-server's
    supervisor_uptime_s: float | None = None
    endpoint: str | None = None
    context: dict[str, Any] | None = None  # context.ContextChoice: the -c it was launched with, and why
    placement: dict[str, Any] | None = None  # --gpus: the cards and the split (devices.with_split)
    health_failures_allowed: int | None = None
    probes: Probes | None = None  # a live server only
    workers: list[WorkerRow] | None = None  # RPC workers (workers_of)
    rpc_placement: dict[str, Any] | None = None  # with workers: the devices in order and the drafter's
    tuned: dict[str, Any] | None = None  # the tune applied at launch, and whether it is still fresh (tuned_of)

    def to_json(self) -> dict[str, Any]:
        out = self.record.to_json() if self.record else {}
        out.update(name=self.name, state=self.state.value, running=self.running, stale=self.stale,
                   record_behind=self.behind,
                   server_pid=self.server_pid, orphan=self.orphan, uptime_s=self.uptime_s,
                   supervisor_uptime_s=self.supervisor_uptime_s, endpoint=self.endpoint,
                   model_files={"target": self.record.target, "draft": self.record.draft} if self.record else None,
                   context=self.context, placement=self.placement,
                   health_failures_allowed=self.health_failures_allowed,
                   workers=[w.to_json() for w in self.workers] if self.workers is not None else None,
                   rpc_placement=self.rpc_placement, tuned=self.tuned)
        if self.probes:
            out.update(self.probes.to_json())
        return out


def status(inst: Instance, api_key: str | None = None) -> InstanceStatus:
    """Everything `buun status` shows of `inst`."""
    r = inst.read()
    running = inst.is_locked()
    if r is None:
        return InstanceStatus(inst.name, State.STOPPED, running)
    stale = not running and r.state.running
    server = live(r.server, "llama-server")
    behind, unrecorded = record_lag.lag(inst, r, running)
    server = unrecorded or server
    started = unrecorded.create_time() if unrecorded else r.server_started_at
    now = time.time()
    data = inst.read_spec()
    url = LaunchSpec.from_json(data).url if data else None
    return InstanceStatus(
        inst.name, State.STOPPED if stale else r.state, running, r, stale=stale, behind=behind,
        server_pid=server.pid if server else None, orphan=bool(server and not running),
        uptime_s=round(now - started, 1) if server and started else None,
        supervisor_uptime_s=round(now - r.started_at, 1) if running and r.started_at else None,
        endpoint=url, context=data.get("context") if data else None,
        placement=data.get("placement") if data else None,
        health_failures_allowed=(data.get("policy") or {}).get("health_failures") if data else None,
        workers=workers_of(data or {}, r, server.pid if server else None),
        rpc_placement=rpc_placement_of(data or {}), tuned=tuned_of(data) if data else None,
        probes=_probe_all(url, api_key or os.environ.get(API_KEY_ENV), server.pid) if server and url else None)


@dataclass(frozen=True)
class WorkerRow:
    """One RPC worker of the launch, as `buun status` shows it."""

    address: str
    devices: list[str]  # its devices in llama-server's order (RPC0, ...)
    connection: str | None  # llama-server's connection to it, from its sockets; None: no server
    lost: str | None  # why the supervisor found it lost
    lost_since: float | None
    next_step: str | None  # what to do about a lost worker

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def workers_of(spec: dict[str, Any], r: Record, server_pid: int | None) -> list[WorkerRow] | None:
    """Each RPC worker of the launch: its address, its devices, llama-server's connection to it (read
    from llama-server's sockets: a probe would queue behind it, rpc.py) and, when the supervisor found
    it lost, why and since when."""
    workers = spec.get("rpc") or []
    if not workers:
        return None
    states = rpc.connections(server_pid, addresses.parse(addresses.join(workers))) if server_pid else {}
    return [WorkerRow(w, [d["name"] for d in spec.get("rpc_devices") or [] if d.get("where") == w],
                      states.get(w), r.lost_workers.get(w), r.lost_since if w in r.lost_workers else None,
                      addresses.next_step(w) if w in r.lost_workers else None) for w in workers]


def tuned_of(launch: dict[str, Any]) -> dict[str, Any]:
    """The tune a launch applied (`applied`, with where it came from), whether it serves AR, and
    the recipe's tune for its cards, build and models now (`now`; `stale`: what changed since)."""
    found = tuned.for_launch(launch)
    return {"applied": launch.get("tuned"), "serves_ar": bool(launch.get("serves_ar")), "now": found.status(),
            "stale": found.stale}


def rpc_placement_of(spec: dict[str, Any]) -> dict[str, Any] | None:
    if not spec.get("rpc"):
        return None
    return {"devices": spec.get("rpc_devices") or [], "draft_device": spec.get("draft_device"),
            "why": spec.get("draft_device_why") or ""}


def _probe_all(url: str, api_key: str | None, pid: int) -> Probes:
    """/health, /slots (or /props), /metrics and nvidia-smi at once, each with a short timeout, so
    a hung server costs `buun status` about STATUS_PROBE_TIMEOUT_S twice (/slots then /props), not
    the sum of every probe's wait."""
    def with_probe(ask: Callable[[Probe], Any]) -> Any:
        probe = Probe(url, api_key, timeout=STATUS_PROBE_TIMEOUT_S)  # one session each: none is shared
        try:
            return ask(probe)
        finally:
            probe.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        health = pool.submit(with_probe, lambda p: p.health().detail)
        slots = pool.submit(with_probe, slots_summary)
        metrics_text = pool.submit(with_probe, lambda p: p.get_text("/metrics"))
        gpu_mem = pool.submit(nvidia.memory_for, pid, STATUS_PROBE_TIMEOUT_S * 2)
        code, text = metrics_text.result()
        stats = metrics.dflash_stats(metrics.parse(text)) if code == 200 else None
        return Probes(health.result(), slots.result(), stats, gpu_mem.result(),
                      dflash_error=NEEDS_KEY if code == 401 else None)


def resolve_name(name: str | None) -> Instance:
    """The instance a command means: the one named, else the only one running, else the only one known."""
    return pick(name, all_instances(), Instance, "instance", "`buun start` or `buun serve`")
