"""`buun worker` with the CPU build's real ggml-rpc-server: start, status, logs, a crash and the
restart, stop; a taken port and an unknown device. Every test ends with no process of its own left
(the `buun` fixture kills leftovers even when a test fails)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from buun_tool.server.process import free_port
from tests.support.fixtures_server import Buun, wait_record

pytestmark = pytest.mark.slow


def flat(text: str) -> str:
    return " ".join(text.split())


def worker_record(b: Buun, name: str) -> dict:
    return json.loads((b.state_dir / "workers" / name / "state.json").read_text())


def wait_worker(b: Buun, name: str, cond: Callable[[dict], bool], timeout: float = 30) -> dict:
    return wait_record(lambda: worker_record(b, name), cond, f"worker {name}", timeout)


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


def test_a_host_of_another_machine_is_named(buun: Buun) -> None:
    """An address no interface here has (a typo, the server's address) is not "in use by another
    program": that sent the user looking for a process that does not exist."""
    r = buun("worker", "start", "--host", "10.255.254.253", "--port", str(free_port()))
    assert r.returncode == 2, r.stderr
    assert "--host 10.255.254.253 is not an address of this machine" in flat(r.stderr)
    assert "in use" not in r.stderr and "ip -4 addr" in flat(r.stderr)
    assert_none_left(buun)


def test_an_unknown_device_is_named(buun: Buun) -> None:
    r = buun("worker", "start", "--port", str(free_port()), "--device", "NOPE0")
    assert r.returncode == 2, r.stderr
    assert "does not know the device given to --device" in flat(r.stderr) and "CPU" in flat(r.stderr)
    assert_none_left(buun)


def test_a_worker_outlives_a_server_killed_mid_request(buun: Buun, llama_bin: Path,
                                                        tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    """Patch 0028: a reply sent to a client that has gone away raises SIGPIPE, which ended the
    worker (exit status 141) when a llama-server was killed or restarted mid-request. The worker
    ignores it: a SIGPIPE sent to it, and llama-servers SIGKILLed while they generate on it, leave
    the same process serving, with no restart."""
    name = str(free_port())
    buun("worker", "start", "--port", name, "--threads", "1", check=True)
    pid = json.loads(buun("worker", "status", name, "--json", check=True).stdout)["worker_pid"]
    os.kill(pid, signal.SIGPIPE)
    time.sleep(0.3)
    assert _alive(pid) and worker_record(buun, name)["restarts"] == 0, "a SIGPIPE ended the worker"
    target, draft = tiny_pair_f32
    for attempt in range(3):
        port = free_port()
        with open(tmp_path / f"server-{attempt}.log", "wb") as log:
            server = subprocess.Popen(
                [str(llama_bin / "llama-server"), "-m", str(target), "-md", str(draft), "--spec-type", "dflash",
                 "-ngl", "99", "-ngld", "99", "-c", "2048", "--rpc", f"127.0.0.1:{name}", "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_health(port, server)
            threading.Thread(target=_generate, args=(port,), daemon=True).start()
            time.sleep(0.5 + 0.3 * attempt)  # somewhere inside the generation, each time elsewhere
        finally:
            server.kill()
            server.wait()
        time.sleep(0.3)
        assert _alive(pid), f"the worker died after server {attempt} was killed (SIGPIPE?)"
    rec = worker_record(buun, name)
    assert rec["restarts"] == 0 and rec["server"]["pid"] == pid
    buun("worker", "stop", name, check=True)
    assert_none_left(buun)


def _wait_health(port: int, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"llama-server on the worker did not come up (exit {server.poll()})")


def _generate(port: int) -> None:
    with contextlib.suppress(requests.RequestException):
        requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hello", "n_predict": 2000}, timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
