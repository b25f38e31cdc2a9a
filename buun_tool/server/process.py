"""Processes: launching llama-server so it cannot outlive whoever launched it, stopping a whole
process group, free ports and naming whoever holds a port.

llama-server runs in a session (and process group) of its own: a Ctrl-C on the terminal reaches
only the supervisor, which stops the server in order. proc.dies_with_us (PR_SET_PDEATHSIG) makes
the kernel kill the server if the supervisor dies without doing so (SIGKILL, OOM killer). The
death signal follows the *thread* that forked, so only the supervisor's main thread launches servers.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import psutil

from buun_tool.base.proc import dies_with_us

# What llama-server (or a worker) writes is its owner's alone, as buun's own state files are
# (fsutil.PRIVATE_FILE): a slot save (--slot-save-path) holds a conversation's cached state, and
# llama-server makes it with the umask's mode (0644 under the usual 022).
CHILD_UMASK = 0o077


def spawn(argv: Sequence[str], env: Mapping[str, str], stdout: int | IO[bytes]) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session, stdout and stderr together, killed if we die, the files it
    makes readable by their owner only (CHILD_UMASK)."""
    return subprocess.Popen(
        list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=dies_with_us(), umask=CHILD_UMASK,
    )


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def wait_group_gone(pgid: int, timeout: float, reap: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait until no process of the group is left (reaping our own child as it exits)."""
    deadline = time.monotonic() + timeout
    while True:
        if reap is not None:
            reap.poll()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_group(pgid: int, grace: float, child: subprocess.Popen[bytes] | None = None) -> str:
    """The stop flow: SIGTERM to the group, wait `grace`, SIGKILL the group, reap.
    Returns how it ended: 'gone', 'terminated' or 'killed'."""
    if not signal_group(pgid, signal.SIGTERM):
        how = "gone"
    elif wait_group_gone(pgid, grace, child):
        how = "terminated"
    else:
        kill_group(pgid, child)
        return "killed"
    _reap(child)
    return how


def kill_group(pgid: int, child: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL the group, wait for it to go, reap: the stop flow's last step, and all of it for a
    hung server, whose graceful exit would wait on the stuck work."""
    signal_group(pgid, signal.SIGKILL)
    wait_group_gone(pgid, 5.0, child)
    _reap(child)


def _reap(child: subprocess.Popen[bytes] | None) -> None:
    """Our own child's exit collected (no zombie left), 5 s at most."""
    if child is not None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def kill_process(proc: psutil.Process, grace: float) -> None:
    """Stop a process that is not our child (a supervisor seen through its PID): SIGTERM, then
    SIGKILL after `grace` (at once when 0)."""
    try:
        if grace > 0:
            proc.terminate()
            try:
                proc.wait(grace)
                return
            except psutil.TimeoutExpired:
                pass
        proc.kill()
        proc.wait(5)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


# --- ports ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PortHolder:
    pid: int | None
    name: str
    cmdline: str

    def describe(self) -> str:
        if self.pid is None:
            return "a process buun cannot see (another user's?)"
        cmd = self.cmdline if len(self.cmdline) < 120 else self.cmdline[:117] + "..."
        return f"pid {self.pid} ({cmd or self.name})"


def port_free(host: str, port: int) -> bool:
    """Can a server bind host:port now? (SO_REUSEADDR as servers set it, so TIME_WAIT is no conflict.)"""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # llama-server will report the bad host itself
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError:
                return False
    return True


def is_local_address(host: str) -> bool:
    """False when no interface of this machine has `host` (binding it fails with EADDRNOTAVAIL,
    which port_free reads as a port in use); True when it is one, or cannot be told."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # the server reports the bad host itself
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server of our own (the kernel's pick; a race with
    another program that binds it first is reported by the server as a bind failure)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_holder(port: int) -> PortHolder | None:
    """The process listening on `port`, when the system lets us see it."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, PermissionError):
        return PortHolder(None, "", "")
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            if c.pid is None:
                return PortHolder(None, "", "")
            try:
                p = psutil.Process(c.pid)
                return PortHolder(c.pid, p.name(), " ".join(p.cmdline()))
            except psutil.Error:
                return PortHolder(c.pid, "?", "")
    return None
