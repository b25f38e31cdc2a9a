"""Waits on states, each with a timeout that fails the test and says what was seen: never a fixed
sleep. `until_blocked_in` waits until a process sleeps in a given system call (/proc/PID/syscall):
a signal that must interrupt a wait is sent only once the process is in it. Sent a moment before,
Python's handler only notes the signal, and acts on it when the interpreter next runs bytecode:
after the blocking call returns, which for a read of a terminal nobody types at is never."""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def until(condition: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> None:
    """Returns once `condition()` is true; fails the test after `timeout` s, saying `what` (or what
    `what()` says then) was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting after {timeout} s for {what() if callable(what) else what}")
        time.sleep(0.01)


def communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """`proc`'s output (stdout, stderr) once it exits; still running after `timeout` s, it is
    killed and the test fails, with what it wrote."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(map(str, proc.args))} still running after {timeout} s; it wrote:\n{out or ''}"
                    f"{err or ''}")


@functools.cache
def syscall_number(call: str) -> str:
    """The number this machine's kernel gives system call `call` ("read", "flock"), as
    /proc/PID/syscall shows it (they differ between architectures): read from a thread of this
    process blocked in one on a descriptor of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        if call == "read":
            fd, other = os.pipe()
            block: Callable[[], object] = functools.partial(os.read, fd, 1)
            release: Callable[[], object] = functools.partial(os.write, other, b"x")
        elif call == "flock":
            other = os.open(Path(tmp) / "lock", os.O_RDWR | os.O_CREAT)
            fcntl.flock(other, fcntl.LOCK_EX)
            fd = os.open(Path(tmp) / "lock", os.O_RDWR)
            block = functools.partial(fcntl.flock, fd, fcntl.LOCK_EX)
            release = functools.partial(fcntl.flock, other, fcntl.LOCK_UN)
        else:
            raise ValueError(call)
        thread = threading.Thread(target=block, name=f"blocked-in-{call}", daemon=True)
        thread.start()
        try:
            where = Path(f"/proc/self/task/{thread.native_id}/syscall")
            fields: list[str] = []
            until(lambda: _blocked(fields, where.read_text().split()) and int(fields[1], 16) == fd, 10,
                  lambda: f"a thread blocked in {call}({fd}): {where} says {' '.join(fields)}")
            return fields[0]
        finally:
            release()
            thread.join(10)
            os.close(fd)
            os.close(other)


def _blocked(into: list[str], fields: list[str]) -> bool:
    """Whether /proc/PID/syscall's `fields` are those of a task asleep in a system call (not
    "running", not -1: blocked outside one); they are copied `into` the list either way."""
    into[:] = fields
    return len(fields) > 1 and fields[0] not in ("running", "-1")


def until_blocked_in(pid: int, call: str, fd: int | None, timeout: float,
                     meanwhile: Callable[[], object] = lambda: None) -> None:
    """Returns once process `pid` (its main thread) sleeps in system call `call` on its descriptor
    `fd` (any descriptor when None): a signal sent now interrupts that very call. `meanwhile` runs
    at each look (to drain the process's terminal, so that it is never blocked writing). Fails the
    test when `pid` ends first or is elsewhere after `timeout` s, saying where it was."""
    number, fields = syscall_number(call), []

    def there() -> bool:
        meanwhile()
        try:
            if _blocked(fields, Path(f"/proc/{pid}/syscall").read_text().split()):
                if fields[0] == number and (fd is None or int(fields[1], 16) == fd):
                    return True
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            state = "gone"
        except PermissionError as exc:  # /proc/PID/syscall needs the right to trace the process
            pytest.fail(f"cannot tell where process {pid} waits: {exc}")
        if state in ("Z", "X", "gone"):
            pytest.fail(f"process {pid} ended before it waited in {call}()")
        return False

    until(there, timeout, lambda: f"process {pid} to wait in {call}({'' if fd is None else fd}) (system call "
                                  f"{number}); /proc/{pid}/syscall says: {' '.join(fields) or 'nothing yet'}")
