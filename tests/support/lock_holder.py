"""A process that holds buun's stage locks (buun_tool.locks), for the tests of a second command that
waits for them (a pytest plugin: the `holders` fixture, and helpers to run `buun` beside it).

    python -m tests.support.lock_holder vendor build:cpu models:DIR converter-env:DIR

holds those locks until its stdin closes (`vendor-shared`: the vendored tree as a build holds it),
and prints `held` once it holds them all.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from buun_tool.base import locks
from tests.support import waits

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def buun(*args: str) -> subprocess.Popen[str]:
    """A real `buun` command in the background, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "buun_tool", *args], env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stderr_until(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """What `proc` wrote on stderr until `text` (or its exit). Still running without it after
    `timeout` s, it is killed and the test fails."""
    assert proc.stderr is not None
    fd, seen = proc.stderr.fileno(), b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(30)
            pytest.fail(f"no {text!r} on the stderr of {' '.join(proc.args)} after {timeout} s; it wrote:\n"
                        f"{seen.decode(errors='replace')}")
        if select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def finish(proc: subprocess.Popen[str], seen: str = "") -> tuple[int, str]:
    """Its exit code and whole stderr (`seen`: what stderr_until read of it); still running after a
    minute, it is killed and the test fails."""
    _, rest = waits.communicate(proc, 60)
    return proc.returncode, seen + rest


def release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(10)


@pytest.fixture
def holders() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a holder of the given locks (`holders("vendor", "build:cpu")`); each lets go when
    released (its stdin closed) or killed, and at the end of the test."""
    started: list[subprocess.Popen[str]] = []

    def start(*what: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.lock_holder", *what], env=env(), text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None
        # a lock it cannot take (another's, left held) would keep it from saying so for ever
        waits.until(lambda: select.select([proc.stdout], [], [], 0.1)[0] or proc.poll() is not None, 60,
                    f"the holder of {', '.join(what)} to say it holds them")
        assert proc.stdout.readline() == "held\n", proc.poll()
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def main(what: list[str]) -> None:
    with contextlib.ExitStack() as stack:
        for item in what:
            kind, _, arg = item.partition(":")
            if kind.startswith("vendor"):
                stack.enter_context(locks.vendor_tree(shared=kind == "vendor-shared"))
            elif kind == "build":
                stack.enter_context(locks.build_folder(arg))
            elif kind == "converter-env":
                stack.enter_context(locks.converter_env(Path(arg)))
            else:
                stack.enter_context(locks.models_folder(Path(arg)))
        print("held", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1:])
