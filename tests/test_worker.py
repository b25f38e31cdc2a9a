"""`buun worker` with the CPU build's real ggml-rpc-server: start, status, logs, a crash and the
restart, stop; a taken port and an unknown device. Every test ends with no process of its own left
(the `buun` fixture kills leftovers even when a test fails)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable

import pytest

from buun_tool.server.process import free_port
from tests.server_helpers import Buun

pytestmark = pytest.mark.slow


def flat(text: str) -> str:
    return " ".join(text.split())


def worker_record(b: Buun, name: str) -> dict:
    return json.loads((b.state_dir / "workers" / name / "state.json").read_text())


def wait_worker(b: Buun, name: str, cond: Callable[[dict], bool], timeout: float = 30) -> dict:
    deadline, last = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            last = worker_record(b, name)
            if cond(last):
                return last
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting on worker {name}; last record: {json.dumps(last, indent=1)}")


def assert_none_left(b: Buun) -> None:
    deadline = time.monotonic() + 5
    while b.ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not b.ours(), f"processes left: {[(p.pid, p.cmdline()) for p in b.ours()]}"


def test_start_status_logs_crash_restart_stop(buun: Buun) -> None:
    port = free_port()
    name = str(port)
    r = buun("worker", "start", "--port", name, "--threads", "1", check=True)
    assert f"listens on 127.0.0.1:{port}" in flat(r.stderr) and f"--rpc 127.0.0.1:{port}" in flat(r.stderr)
    st = json.loads(buun("worker", "status", name, "--json", check=True).stdout)
    assert st["state"] == "ready" and st["listening"] is True and st["clients"] == [] and st["threads"] == 1
    assert st["command"][1:] == ["-H", "127.0.0.1", "-p", name, "-t", "1"]
    text = buun("worker", "status", check=True).stdout
    assert f"worker {name}  ready" in text and "no server connected" in text
    logs = buun("worker", "logs", name, check=True).stdout
    assert "Starting RPC server" in logs and f"ready: ggml-rpc-server is ready on 127.0.0.1:{port}" in logs

    again = buun("worker", "start", "--port", name)
    assert again.returncode == 8 and f"`buun worker stop {name}` first" in flat(again.stderr)

    old = st["worker_pid"]
    os.kill(old, signal.SIGKILL)
    rec = wait_worker(buun, name, lambda r: r["state"] == "ready" and r["server"] and r["server"]["pid"] != old)
    assert rec["restarts"] == 1 and rec["crashes"] == 1 and "SIGKILL" in rec["last_crash"]
    assert rec["supervisor"]["pid"] == st["supervisor"]["pid"]

    r = buun("worker", "stop", check=True)  # the only one
    assert f"worker {name}: stopped" in r.stderr
    assert worker_record(buun, name)["state"] == "stopped"
    assert_none_left(buun)


def test_a_taken_port_is_named(buun: Buun) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = buun("worker", "start", "--port", str(port))
    assert r.returncode == 8, r.stderr
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in flat(r.stderr)
    assert_none_left(buun)


def test_an_unknown_device_is_named(buun: Buun) -> None:
    r = buun("worker", "start", "--port", str(free_port()), "--device", "NOPE0")
    assert r.returncode == 2, r.stderr
    assert "does not know the device given to --device" in flat(r.stderr) and "CPU" in flat(r.stderr)
    assert_none_left(buun)
