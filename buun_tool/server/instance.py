"""One folder per named instance: its lock, state record, launch spec and logs.

The lock (fcntl.flock on `lock`) is held by the instance's supervisor for its whole life, so
"the lock is held" is the one true answer to "is it running": no PID check can race with a
start. Only the lock holder writes the state record; readers cope with a record left behind
by a supervisor that died (stale: the lock is free, or the PID now belongs to another program).

A lock file can be deleted under its holder (`rm -rf` of the state folder): a start that made a
new one would take it and run beside the supervisor, which makes its files again only at its next
check. So a launch also takes the instance's guard, an abstract Unix socket (Linux) bound for the
supervisor's life, which no file operation removes; a start that gets the lock but not the guard
is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import psutil

from buun_tool.base import paths
from buun_tool.base.errors import Exit, UsageError
from buun_tool.base.fsutil import PRIVATE_FILE, open_private, private_dir, write_json_atomic
from buun_tool.server.state import ProcRef, Record


def check_name(name: str) -> str:
    if not paths.FOLDER_NAME.fullmatch(name):
        raise UsageError(f"instance name {name!r} is not valid", f"use {paths.FOLDER_NAME_RULE}")
    return name


class Instance:
    """A supervised llama-server. A worker (worker.WorkerInstance) is the same with its own root,
    program and commands."""

    program = "llama-server"  # what the supervisor runs: names it in messages, finds it among processes
    log_name = "server.log"
    start_command = "buun start"  # how a user starts one again, for hints
    record_class = Record

    def __init__(self, name: str):
        self.name = check_name(name)
        self.dir = self.root() / name

    @staticmethod
    def root() -> Path:
        return paths.instances_dir()

    def command(self, verb: str) -> str:
        """The buun command that does `verb` to this instance, for hints: `buun logs NAME`."""
        return f"buun {verb} {self.name}"

    lock_file = property(lambda self: self.dir / "lock")
    state_file = property(lambda self: self.dir / "state.json")
    spec_file = property(lambda self: self.dir / "spec.json")  # the launch that runs (or ran) last
    service_spec_file = property(lambda self: self.dir / "service.json")  # the launch its systemd unit runs
    log_file = property(lambda self: self.dir / self.log_name)
    supervisor_log = property(lambda self: self.dir / "supervisor.log")

    # --- the lock -------------------------------------------------------------------------

    def make_dir(self) -> Path:
        """The instance folder, and the state and instances (or workers) folders above it, private (0700)."""
        for d in (paths.state_dir(), self.root(), self.dir):
            private_dir(d)
        return self.dir

    def try_lock(self, wait: float = 0.5) -> int | None:
        """An fd holding the instance lock, or None when another process holds it. A command that
        reads the instance (is_locked: `buun status`, a monitoring script's) holds the lock for a
        moment: a lock still held after `wait` s is another buun's."""
        self.make_dir()
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.01)

    def is_locked(self) -> bool:
        """Is a supervisor alive for this instance? Probes the lock shared and lets it go: two
        probes never see each other as a supervisor (an exclusive probe did, and failed a start
        or stop that came at the same moment). A lock file deleted under it: its guard says."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY)
        except FileNotFoundError:
            return self.guarded()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return self.guarded()

    def _guard_name(self, make_key: bool) -> bytes | None:
        """The guard's abstract socket name: this instance's folder under a random key of this
        user's (guard.key, 0600), so that another user cannot take the name first and block it;
        None when there is no key (`make_key` off)."""
        key = paths.state_dir() / "guard.key"
        if make_key and not key.exists():
            private_dir(key.parent)
            part = key.with_name(f".guard.key.{os.getpid()}")
            with open_private(part, append=False) as f:
                f.write(os.urandom(32))
            try:
                os.link(part, key)  # whole, and the first one made wins
            except FileExistsError:
                pass
            finally:
                part.unlink()
        try:
            secret = key.read_bytes()
        except FileNotFoundError:
            return None
        return b"\0buun/" + hashlib.sha256(secret + os.fsencode(self.dir.resolve())).hexdigest().encode()

    def take_guard(self) -> int | None:
        """An fd (a socket) holding the instance's guard, or None when another process holds it."""
        name = self._guard_name(make_key=True)
        assert name is not None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.bind(name)
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                return None
            raise
        return s.detach()

    def guarded(self) -> bool:
        """Does a process hold the instance's guard? A datagram socket connects to a bound name
        only: the probe takes nothing."""
        name = self._guard_name(make_key=False)
        if name is None:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                s.connect(name)
            except OSError:
                return False
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        fd = self.try_lock()
        if fd is None:
            raise UsageError(f"instance {self.name} is busy (a supervisor holds its lock)",
                             f"`{self.command('status')}` shows it", Exit.CONFLICT)
        try:
            yield fd
        finally:
            os.close(fd)

    # --- the record -----------------------------------------------------------------------

    def read(self) -> Record | None:
        try:
            return self.record_class.from_json(json.loads(self.state_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError):
            return None

    def write(self, record: Record) -> None:
        """Atomic (rename), so a reader never sees half a record. Lock holders only."""
        record.updated_at = time.time()
        self.make_dir()
        write_json_atomic(self.state_file, record.to_json(), private=True)

    def read_spec(self) -> dict | None:
        return _read_json(self.spec_file)

    def write_spec(self, data: dict) -> None:
        self.make_dir()
        write_json_atomic(self.spec_file, data, private=True)

    def read_service_spec(self) -> dict | None:
        return _read_json(self.service_spec_file)

    def write_service_spec(self, data: dict) -> None:
        self.make_dir()
        write_json_atomic(self.service_spec_file, data, private=True)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


InstanceT = TypeVar("InstanceT", bound="Instance")


def all_of(kind: type[InstanceT]) -> list[InstanceT]:
    """Every instance of `kind` (a server's or a worker's) under its root, by name; a folder whose
    name no instance can have is none of them."""
    root = kind.root()
    if not root.is_dir():
        return []
    return [kind(d.name) for d in sorted(root.iterdir()) if d.is_dir() and paths.FOLDER_NAME.fullmatch(d.name)]


def all_instances() -> list[Instance]:
    return all_of(Instance)


def pick(name: str | None, known: list[InstanceT], make: type[InstanceT], kind: str, start: str) -> InstanceT:
    """The instance (server or worker) a command means: the one named, else the only one running,
    else the only one known; `kind` names what it is in the errors, `start` the command that makes one."""
    if name:
        inst = make(name)
        if not inst.dir.is_dir():
            raise UsageError(f"no {kind} named {name}",
                             f"{kind}s: {', '.join(i.name for i in known)}" if known else f"start one with {start}")
        return inst
    running = [i for i in known if i.is_locked()]
    for group in (running, known):
        if len(group) == 1:
            return group[0]
    if not known:
        raise UsageError(f"no {kind} exists yet", f"start one with {start}")
    raise UsageError(f"more than one {kind}: name the one you mean",
                     f"{kind}s: {', '.join(i.name for i in (running or known))}")


# --- processes named in a record --------------------------------------------------------------

def ref_of(pid: int) -> ProcRef:
    return ProcRef(pid, psutil.Process(pid).create_time())


def live(ref: ProcRef | None, cmd_hint: str | None = None) -> psutil.Process | None:
    """The process a record names, if it is still that process: same PID, same start time and,
    with `cmd_hint`, that text in its command line. A reused PID gives None."""
    if ref is None:
        return None
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.create_time) > 0.05:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if cmd_hint and cmd_hint not in " ".join(proc.cmdline()):
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
