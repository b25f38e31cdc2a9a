"""An RPC worker: a supervised `ggml-rpc-server` that lends this machine's devices to a
llama-server elsewhere (`buun serve --rpc`). `buun worker start|stop|status|logs`.

A worker is a small sibling of a server instance: its own folder under the state dir
(paths.workers_dir(), one per worker, named by its port unless --name), the same lock, record,
launch spec, log rotation and supervisor loop (supervisor.py), with the hooks where a worker
differs: it is ready once its port accepts a connection, and it is healthy while it runs (a
probe would wait in its queue behind the llama-server it serves: rpc.py).

RPC has no authentication: whoever reaches the port can use the devices and read and write their
memory. So a worker binds 127.0.0.1 unless given an address, and `check_bind` refuses an address
that is not loopback, private or link-local (the wildcard 0.0.0.0 included) unless --allow-public
says why; the reason is kept in the record and the log.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from buun_tool.base import command, console, paths
from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.pipeline import build
from buun_tool.server import control, loglines, process, record_lag
from buun_tool.server.addresses import DEFAULT_PORT, Endpoint
from buun_tool.server.health import Health
from buun_tool.server.instance import Instance, all_of, check_name, live, pick, ref_of
from buun_tool.server.spec import Policy
from buun_tool.server.state import Record, State
from buun_tool.server.supervise import Listener, Supervisor, detached_output, report

DEFAULT_HOST = "127.0.0.1"
PROGRAM = "ggml-rpc-server"


@dataclass
class WorkerRecord(Record):
    allow_public: str | None = None  # why it binds beyond private addresses (--allow-public)


class WorkerInstance(Instance):
    program = PROGRAM
    log_name = "worker.log"
    start_command = "buun worker start"
    record_class = WorkerRecord

    @staticmethod
    def root() -> Path:
        return paths.workers_dir()

    def command(self, verb: str) -> str:
        return f"buun worker {verb} {self.name}"

    def read(self) -> WorkerRecord | None:
        return super().read()  # type: ignore[return-value]  # record_class


def all_workers() -> list[WorkerInstance]:
    return all_of(WorkerInstance)


# --- the address ------------------------------------------------------------------------------

def check_bind(host: str, allow_public: str | None) -> str | None:
    """Refuse to bind an address other machines outside the private networks can reach, unless
    `allow_public` gives the reason. Returns the reason kept, if the address needs one."""
    if allow_public is not None and not allow_public.strip():
        raise UsageError("--allow-public needs a reason: who must reach this worker, and why a tunnel will not do",
                         '--allow-public "REASON"')
    try:
        ip = ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(f"--host {host!r} is not an IPv4 address",
                         "ggml-rpc-server binds one IPv4 address: give it as digits, e.g. --host 10.0.0.5 "
                         "(this machine's address on the network the server reaches it by)") from None
    if ip.is_loopback or (ip.is_private and not ip.is_unspecified) or ip.is_link_local:
        if allow_public is not None:
            console.warn(f"--allow-public is not needed for {host}: it is a loopback or private address")
        return None
    if allow_public is None:
        what = "every address of this machine, public ones included" if ip.is_unspecified else "a public address"
        raise UsageError(
            f"--host {host} is {what}: RPC has no authentication, so anyone who reaches its port can "
            "use this machine's devices and read and write their memory",
            "bind 127.0.0.1 (the default) and reach it through an SSH tunnel, or a private address (10.x, "
            '172.16-31.x, 192.168.x); to bind it anyway, say why: --allow-public "REASON"')
    return allow_public.strip()


# --- the launch -------------------------------------------------------------------------------

@dataclass
class WorkerSpec:
    name: str
    binary: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    threads: int | None = None  # the CPU device's threads (ggml-rpc-server's default: 1)
    devices: str | None = None  # ggml-rpc-server -d: which devices to lend (default: every GPU, else the CPU)
    cache: bool = False  # -c: keep received tensors in a local file cache (faster relaunches)
    allow_public: str | None = None
    policy: Policy = field(default_factory=Policy)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def argv(self) -> list[str]:
        return [self.binary, "-H", self.host, "-p", str(self.port),
                *(["-t", str(self.threads)] if self.threads else []),
                *(["-d", self.devices] if self.devices else []), *(["-c"] if self.cache else [])]

    @property
    def url(self) -> str:
        return str(Endpoint(self.host, self.port))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerSpec:
        d = dict(data)
        d["policy"] = Policy(**d.get("policy", {}))
        return cls(**d)


def resolve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, name: str | None = None,
            allow_public: str | None = None, threads: int | None = None, devices: str | None = None,
            cache: bool = False) -> WorkerSpec:
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: expected 1..65535")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: expected 1 or more")
    reason = check_bind(host, allow_public)
    return WorkerSpec(check_name(name or str(port)), str(build.find_binary(PROGRAM)), host, port, threads,
                      devices, cache, reason)


class WorkerSupervisor(Supervisor):
    """The supervisor's loop on ggml-rpc-server."""

    READY_SIGN = "its port not accepting connections"

    def _new_record(self) -> Record:
        spec = self.spec
        return WorkerRecord(name=spec.name, run_id=spec.run_id, supervisor=ref_of(os.getpid()), host=spec.host,
                            port=spec.port, command=list(spec.argv), started_at=time.time(),
                            log=str(self.inst.log_file), allow_public=spec.allow_public)

    def _ready_probe(self) -> bool:
        try:
            with socket.create_connection((command.probe_host(self.spec.host), self.spec.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _health(self) -> Health:
        return Health(True, "running")  # its process is watched; a probe would queue (rpc.py)

    def _diagnose(self, lines: list[str]) -> loglines.Failure | None:
        return diagnose(lines)

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def run(self) -> None:
        if self.spec.allow_public:
            self.log.event(f"binding {self.spec.host}, beyond private addresses: {self.spec.allow_public}")
        super().run()


def diagnose(lines: list[str]) -> loglines.Failure | None:
    """ggml-rpc-server's own failures (tools/rpc/rpc-server.cpp)."""
    text = "\n".join(lines)
    if "error: unknown device" in text:
        listed = [ln.strip() for ln in lines if ln.startswith("  ")]
        return loglines.Failure("bad-value", "ggml-rpc-server does not know the device given to --device "
                                f"(devices here: {'; '.join(listed) or 'none'})",
                                "pass --device with names from that list, comma-separated", True, Exit.USAGE)
    if "Failed to create server socket" in text or "Invalid host address" in text:
        return loglines.Failure("bind", "ggml-rpc-server could not listen (the port is taken, or the address is "
                                "not this machine's)", "pass --port N, or --host with an address of this machine",
                                True, Exit.CONFLICT)
    if "No devices found" in text:
        return loglines.Failure("crash", "ggml-rpc-server found no device to lend", "run `buun doctor`", True)
    return None


def launch(spec: WorkerSpec, *, wait: bool = True, progress: control.Progress | None = None,
           foreground: Listener | None = None) -> Record | None:
    """Start a worker as control.launch starts a server: the lock first, then the supervisor,
    detached (returns once it listens) or in the foreground."""
    inst = WorkerInstance(spec.name)
    fd, guard = control.claim(inst)
    try:
        _check_port(spec)
        inst.write_spec(spec.to_json())
        if foreground is not None:
            WorkerSupervisor(spec, inst, listener=foreground, lock_fd=fd).run()  # type: ignore[arg-type]
            return inst.read()
        sup = control.spawn_detached("buun_tool.server.worker", inst, fd, guard, dict(os.environ))
    finally:
        os.close(fd)
        os.close(guard)
    return control.wait_for(inst, spec.run_id, sup, progress) if wait else None


def _check_port(spec: WorkerSpec) -> None:
    if not process.is_local_address(spec.host):  # port_free would say "in use by another program"
        raise UsageError(f"--host {spec.host} is not an address of this machine",
                         "bind one of its own (`ip -4 addr` lists them), or 127.0.0.1 and an SSH tunnel")
    if process.port_free(spec.host, spec.port):
        return
    owner = next((w.name for w in all_workers() if (r := w.read()) and r.port == spec.port and r.state.running), None)
    holder = process.port_holder(spec.port)
    who = f"buun worker {owner}" if owner else holder.describe() if holder else "another program"
    raise BuunError(f"port {spec.port} on {spec.host} is in use by {who}",
                    f"pass --port N for a free port{f', or `buun worker stop {owner}`' if owner else ''}",
                    Exit.CONFLICT)


# --- status -----------------------------------------------------------------------------------

@dataclass
class WorkerStatus:
    name: str
    state: State
    running: bool  # a supervisor holds the lock
    record: WorkerRecord | None = None
    behind: str | None = None  # why the live supervisor's record is older than what it does (record_lag.lag)
    address: str | None = None
    pid: int | None = None
    uptime_s: float | None = None
    listening: bool | None = None  # its port is open (read from its sockets, not probed)
    clients: list[str] = field(default_factory=list)  # the llama-servers connected to it now
    threads: int | None = None
    devices: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = self.record.to_json() if self.record else {}
        out.update(name=self.name, state=self.state.value, running=self.running, record_behind=self.behind,
                   address=self.address, worker_pid=self.pid, uptime_s=self.uptime_s, listening=self.listening,
                   clients=self.clients,
                   threads=self.threads, devices=self.devices)
        return out


def status(inst: WorkerInstance) -> WorkerStatus:
    r = inst.read()
    running = inst.is_locked()
    spec = inst.read_spec() or {}
    if r is None:
        return WorkerStatus(inst.name, State.STOPPED, running)
    behind, unrecorded = record_lag.lag(inst, r, running)
    proc = unrecorded or live(r.server, PROGRAM)
    started = unrecorded.create_time() if unrecorded else r.server_started_at
    listening, clients = _sockets(proc, r.port) if proc else (None, [])
    stale = not running and r.state.running
    return WorkerStatus(
        inst.name, State.STOPPED if stale else r.state, running, r, behind=behind,
        address=str(Endpoint(r.host, r.port)), pid=proc.pid if proc else None,
        uptime_s=round(time.time() - started, 1) if proc and started else None,
        listening=listening, clients=clients, threads=spec.get("threads"), devices=spec.get("devices"))


def _sockets(proc: psutil.Process, port: int) -> tuple[bool | None, list[str]]:
    """Does the worker listen on its port, and who is connected to it (its own sockets, as a
    connection would queue behind the client it serves)?"""
    try:
        conns = proc.net_connections(kind="inet")
    except psutil.Error:
        return None, []
    listening = any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)
    clients = [f"{c.raddr.ip}:{c.raddr.port}" for c in conns
               if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port and c.raddr]
    return listening, clients


def resolve_name(name: str | None) -> WorkerInstance:
    """The worker a command means: the one named (or by its port), else the only one running, else the only one."""
    return pick(name, all_workers(), WorkerInstance, "worker", "`buun worker start`")


# --- entry point: `buun worker start`'s detached supervisor ------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m buun_tool.server.worker",
                                     description="Supervise one RPC worker, detached (`buun worker start`).")
    parser.add_argument("name")
    parser.add_argument("--lock-fd", type=int, required=True, help="inherited fd holding the worker's lock")
    parser.add_argument("--guard-fd", type=int, required=True, help="inherited fd holding the worker's guard")
    args = parser.parse_args(argv)
    listener = report
    inst = WorkerInstance(args.name)
    try:
        data = inst.read_spec()
        if data is None:
            print(f"no launch spec in {inst.spec_file}", file=sys.stderr)
            return int(Exit.NOT_READY)
        spec = WorkerSpec.from_json(data)
        listener = detached_output(inst, spec.policy)
        WorkerSupervisor(spec, inst, listener=listener, lock_fd=args.lock_fd).run()  # type: ignore[arg-type]
    except BuunError as exc:
        listener("failed", f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        return int(exc.exit_code)
    finally:
        os.close(args.lock_fd)
        os.close(args.guard_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
