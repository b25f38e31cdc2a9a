"""llama-server's RPC backend from the server's side: the workers named by `--rpc host:port,...`,
whether each answers, where the target's layers and the drafter go, and whether a running
llama-server still holds its connection to each.

A worker (`ggml-rpc-server`, run by `buun worker start`) serves one client at a time and listens
with a backlog of one: a connection made while it serves llama-server waits in its queue, and once
two wait, the next is dropped. So a worker is probed with a plain TCP connect only while no
llama-server of ours is connected to it (before a launch, after one ended); while the server
runs, its own connections tell whether a worker is gone (`connections`). The probe sends nothing:
the worker reads end-of-file where it expects a hello and goes back to accepting.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from buun_tool.base import command
from buun_tool.base.command import Flag
from buun_tool.base.errors import NotReadyError
from buun_tool.server import loglines
from buun_tool.server.addresses import Endpoint, check_distinct, join, next_step

PROBE_TIMEOUT = 3.0
LIST_TIMEOUT = 20.0  # `llama-server --rpc ... --list-devices`: a busy worker never answers
RPC_DEVICE = re.compile(r"RPC\d+")

# --- is it there? ---------------------------------------------------------------------------

def probe(ep: Endpoint, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when something accepts a connection at `ep`, else why not. Only while no server of
    ours is connected to it (see the module's docstring)."""
    try:
        addr = socket.gethostbyname(ep.host)  # IPv4, as llama-server connects
        with socket.create_connection((addr, ep.port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"the host {ep.host} is not known"
    except ConnectionRefusedError:
        return "nothing listens there"
    except TimeoutError:
        return f"no answer within {timeout:g} s (host down, a firewall, or the worker busy with another server)"
    except OSError as exc:
        return exc.strerror or str(exc)


def not_a_worker(ep: Endpoint, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether a program took a connection at `ep` and did something with it, which a worker busy
    with another llama-server does not: the new connection waits in its queue, unread, and our end
    closed for writing gets no answer. Another program (a web server) reads the end and closes its
    side, or says something first. An idle worker would too, so only when `ep` left a worker's
    client waiting. Sends no byte."""
    try:
        addr = socket.gethostbyname(ep.host)
        with socket.create_connection((addr, ep.port), timeout=timeout) as s:
            s.shutdown(socket.SHUT_WR)
            s.recv(1)  # its first byte, or its end
            return True
    except ConnectionResetError:
        return True
    except OSError:  # a timeout (no one reads: a busy worker's queue), nothing there, an unknown host
        return False


def unreachable(endpoints: Sequence[Endpoint], timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """{worker: why} for each worker that does not answer."""
    return {str(ep): why for ep in endpoints if (why := probe(ep, timeout)) is not None}


def check_reachable(endpoints: Sequence[Endpoint]) -> None:
    """Before a launch: the workers are distinct and every one answers, or an error naming those
    that do not."""
    check_distinct(endpoints)
    lost = unreachable(endpoints)
    if lost:
        lines = "; ".join(f"worker {w} is not reachable ({why})" for w, why in lost.items())
        raise NotReadyError(lines, "; ".join(next_step(w) for w in lost))


# --- where things run -----------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    name: str  # llama-server's: RPC0, RPC1, ..., CUDA0
    where: str  # the worker's address, or "local"


@dataclass(frozen=True)
class Placement:
    devices: list[Device]  # in llama-server's order: the target's layers are split over them in turn
    draft_device: str | None  # the device that holds the drafter (-devd), None when left to llama-server
    why: str


def list_devices(binary: str, endpoints: Sequence[Endpoint], env: dict[str, str] | None = None) -> list[Device]:
    """The devices llama-server uses with these workers, in the order it splits the layers over
    them: each worker's devices, named RPC0, RPC1, ... in the order of --rpc, then the local GPUs.
    `--list-devices` lists the local ones first; the model puts the RPC ones first (llama.cpp's
    llama_prepare_model_devices: "add RPC servers at the front of the list to minimize network
    transfers"; seen on an H100 with a worker: "using device RPC0", then "using device CUDA0")."""
    argv = [binary, *(["--rpc", join(endpoints)] if endpoints else []), "--list-devices"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=LIST_TIMEOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})})  # the cards the server will see (devices.py)
    except subprocess.TimeoutExpired:
        others = [str(ep) for ep in endpoints if not_a_worker(ep)]
        if others:  # a web server, say: it reads llama-server's hello as the start of a request, and waits
            raise NotReadyError(f"{', '.join(others)} answers, but not as ggml-rpc-server does: llama-server's "
                                f"hello got no reply within {LIST_TIMEOUT:g} s (another program on the port)",
                                loglines.NOT_A_WORKER_HINT) from None
        raise NotReadyError(
            f"llama-server could not list the devices of the workers {join(endpoints)} within {LIST_TIMEOUT:g} s",
            "a worker serves one llama-server at a time: stop the other server using it, or start another "
            "worker") from None
    devices = []
    for line in out.stdout.splitlines():
        m = re.match(r"\s+(\S+): (.*?)(?: \(\d+ MiB, \d+ MiB free\))?$", line)
        if m:
            devices.append(Device(m[1], m[2] if RPC_DEVICE.fullmatch(m[1]) else "local"))
    if out.returncode != 0 or not any(RPC_DEVICE.fullmatch(d.name) for d in devices):
        # a known cause first: ggml-rpc aborts, and the last lines are then gdb's backtrace
        known = loglines.diagnose((out.stdout + out.stderr).splitlines())
        if known is not None and known.kind == "rpc":
            raise NotReadyError(f"{known.message} (--rpc {join(endpoints)})", known.hint)
        tail = " ".join((out.stdout + out.stderr).strip().splitlines()[-3:])
        raise NotReadyError(f"llama-server could not list the workers' devices ({join(endpoints)}): {tail}",
                            "check that every worker runs `buun worker start` of this buun version")
    return [d for d in devices if d.where != "local"] + [d for d in devices if d.where == "local"]


def place(devices: Sequence[Device], flags: Sequence[Flag]) -> Placement:
    """The drafter on the device that holds the target's last layers, unless the flags say where.

    Why: the DFlash drafter computes its logits with the target's own output matrix, which sits
    with the target's last layers; on another device the scheduler cannot use it (seen on an H100
    with a worker: `-devd RPC0` aborts with "pre-allocated tensor (output.weight) in a buffer
    (CUDA0) that cannot run the operation"). llama-server's default splits the drafter's few
    layers over every device like the target's, a network round trip each per draft step; on that
    one device drafting crosses no network. The devices are in llama-server's order (list_devices)
    and the layers are split over them in turn, so with every layer offloaded the last layers and
    the output are on the last one: a local GPU when there is one, else the last worker's last
    device. `-dev` (the user's list) keeps its order; `-devd` is the user's choice and stays."""
    given = {command.canonical(n): v for n, v in flags}
    if given.get("-devd"):
        return Placement(list(devices), given["-devd"], "-devd given")
    if given.get("-dev"):
        names = [d.strip() for d in str(given["-dev"]).split(",") if d.strip() and d.strip() != "none"]
        listed = [d for name in names for d in devices if d.name == name]
        last = names[-1] if names else None
        return Placement(listed or list(devices), last, "the last device of -dev")
    gpus = [d for d in devices if d.name != "CPU"]
    if not gpus:
        return Placement(list(devices), None, "no device to place it on")
    last = gpus[-1]
    why = "the local GPU that holds the target's last layers" if last.where == "local" else \
        "the last worker's device, which holds the target's last layers"
    return Placement(gpus, last.name, why)


def assumed_devices(endpoints: Sequence[Endpoint], local_cards: int = 0) -> list[Device]:
    """One device per worker, as `buun worker start` gives without --device, then the local cards
    (CUDA0, ...): for --print-cmd, which asks no worker."""
    return [*(Device(f"RPC{i}", str(ep)) for i, ep in enumerate(endpoints)),
            *(Device(f"CUDA{i}", "local") for i in range(local_cards))]


# --- a running server's connections -----------------------------------------------------------

def connections(pid: int, endpoints: Sequence[Endpoint]) -> dict[str, str]:
    """{worker: state} of llama-server `pid`'s connections to its workers: "connected", "closed by
    the worker" (its end is gone: llama-server fails at its next request) or "not connected"."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.Error:
        return {}
    out = {}
    for ep in endpoints:
        addrs = _addresses(ep.host)
        states = [c.status for c in conns if c.raddr and c.raddr.port == ep.port and c.raddr.ip in addrs]
        out[str(ep)] = ("connected" if psutil.CONN_ESTABLISHED in states else
                        "closed by the worker" if states else "not connected")
    return out


def _addresses(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)}
    except socket.gaierror:
        return set()


def lost_in(states: dict[str, str]) -> list[str]:
    return [w for w, s in states.items() if s == "closed by the worker"]
