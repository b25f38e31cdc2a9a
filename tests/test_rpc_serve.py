"""The tiny pair served through two local CPU RPC workers started by `buun worker` (llama-server's
--rpc, `buun serve --rpc`): greedy DFlash output equals local AR output; a worker killed mid-request
gives the client an error, not a hang, and `buun status` names the lost worker; once the worker is
back the server serves again. Also a worker lost while the server is idle, and one that stops
answering without closing its connection (SIGSTOP: as a frozen machine or a lost network)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from buun_tool.server.process import free_port
from tests.support.fixtures_server import TEST_FLAGS, Buun
from tests.support.real_llama_server import Server, llama_server
from tests.test_correctness import EXACT, PROMPTS
from tests.test_worker import assert_none_left, flat

pytestmark = pytest.mark.slow

N_GEN = 32  # enough for DFlash's verify steps to matter (random weights: ~0 accepted per step)


def start_workers(b: Buun, n: int = 2) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        if (port := free_port()) not in ports:
            ports.append(port)
    for port in ports:
        b("worker", "start", "--port", str(port), check=True)
    return ports


def rpc_arg(ports: list[int]) -> str:
    return ",".join(f"127.0.0.1:{p}" for p in ports)


def test_greedy_dflash_over_two_workers_is_local_ar(buun: Buun, llama_bin: Path,
                                                     tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    b = Buun(buun.state_dir, tiny_pair_f32, buun.compat)  # exact arithmetic: f32 weights and EXACT's KV
    workers, port = start_workers(b), free_port()
    b.start("rpc", port, "--rpc", rpc_arg(workers), extra=(*TEST_FLAGS, "-c", "2048", *EXACT))
    st = b.status("rpc")
    assert st["rpc_placement"]["draft_device"] == "RPC1" and "last layers" in st["rpc_placement"]["why"]
    assert [(w["address"], w["devices"], w["connection"]) for w in st["workers"]] == [
        (f"127.0.0.1:{workers[0]}", ["RPC0"], "connected"), (f"127.0.0.1:{workers[1]}", ["RPC1"], "connected")]
    assert "-devd RPC1" in " ".join(st["command"])
    text = b("status", "rpc", check=True).stdout
    assert f"drafter    on RPC1 (127.0.0.1:{workers[1]})" in text
    assert f"split over RPC0 (127.0.0.1:{workers[0]}), RPC1 (127.0.0.1:{workers[1]})" in text
    for w in workers:
        assert json.loads(b("worker", "status", str(w), "--json", check=True).stdout)["clients"], "no server on it"

    got = Server(f"http://127.0.0.1:{port}", b.state_dir / "instances" / "rpc" / "server.log").complete(
        PROMPTS[0], N_GEN)
    assert got["timings"]["draft_n"] > 0, "no draft was verified: DFlash did not run"
    target, _ = tiny_pair_f32
    with llama_server(llama_bin, ["-m", str(target), "-np", "1", "-c", "2048", *EXACT], tmp_path / "ar.log") as ar:
        assert got["tokens"] == ar.complete(PROMPTS[0], N_GEN)["tokens"]

    b("stop", "rpc", check=True)
    b("worker", "stop", "--all", check=True)
    assert_none_left(b)


def test_bench_splits_every_server_over_the_workers(buun: Buun, tmp_path: Path) -> None:
    """`buun bench --rpc`: AR and DFlash servers over a worker as `buun serve --rpc` runs them (the
    drafter on the worker's device: this host has no GPU), recorded in bench.json."""
    [worker] = start_workers(buun, 1)
    target, draft = buun.pair
    r = buun("bench", "--target", str(target), "--drafter", str(draft), "--rpc", f"127.0.0.1:{worker}",
             "--synthetic-al", "3", "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "8",
             "--ctx", "1024", "--server-args=-nr", "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["options"]["workers"] == {"rpc": [f"127.0.0.1:{worker}"], "draft_device": "RPC0"}
    ar, dflash = data["commands"]["ar"], data["commands"]["dflash-al3"]
    for argv in (ar, dflash):
        assert argv[argv.index("--rpc") + 1] == f"127.0.0.1:{worker}"
    assert dflash[dflash.index("-devd") + 1] == "RPC0" and "-devd" not in ar
    rows = {row["config"]: row for row in data["summary"]}
    assert rows["ar"]["decode_tps"] > 0 and rows["dflash-al3"]["drafted"] > 0
    buun("worker", "stop", "--all", check=True)
    assert_none_left(buun)


def _stream(port: int, outcome: dict[str, object], first: threading.Event) -> None:
    """A long streamed completion; records how it ended (a hang shows as ReadTimeout)."""
    s = requests.Session()
    s.trust_env = False
    began = time.monotonic()
    try:
        with s.post(f"http://127.0.0.1:{port}/completion", stream=True, timeout=(5, 30),
                    json={"prompt": "Hello", "n_predict": 4000, "ignore_eos": True, "temperature": 0,
                          "stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    first.set()
        outcome["end"] = "complete"
    except requests.RequestException as exc:
        outcome["end"] = type(exc).__name__
    finally:
        outcome["seconds"] = time.monotonic() - began
        first.set()


def test_a_lost_worker_fails_the_request_is_named_and_comes_back(buun: Buun) -> None:
    workers, port = start_workers(buun), free_port()
    buun.start("rpc", port, "--rpc", rpc_arg(workers), extra=TEST_FLAGS)
    lost = f"127.0.0.1:{workers[1]}"
    old = buun.record("rpc")["server"]["pid"]

    outcome: dict[str, object] = {}
    first = threading.Event()
    client = threading.Thread(target=_stream, args=(port, outcome, first), daemon=True)
    client.start()
    assert first.wait(30), "the request never started"
    buun("worker", "stop", str(workers[1]), check=True)
    client.join(40)
    print(f"the client, its worker stopped mid-request: {outcome}")  # for the record of what llama-server does
    assert not client.is_alive() and outcome["end"] not in ("complete", "ReadTimeout"), outcome  # an error, no hang

    rec = buun.wait_state("rpc", lambda r: r["state"] == "backoff" and lost in r["lost_workers"])
    assert f"worker {lost} lost (nothing listens there)" in rec["last_crash"]
    assert "not as ggml-rpc-server does" not in rec["last_crash"], rec["last_crash"]  # one cause, the one seen
    st = buun.status("rpc")
    entry = next(w for w in st["workers"] if w["address"] == lost)
    assert entry["lost"] == "nothing listens there" and f"buun worker start --port {workers[1]}" in entry["next_step"]
    text = flat(buun("status", "rpc", check=True).stdout)
    assert f"worker {lost} (RPC1): LOST since" in text and f"`buun worker start --port {workers[1]}`" in text
    assert f"worker {lost} lost" in buun("logs", "rpc", check=True).stdout

    buun("worker", "start", "--port", str(workers[1]), check=True)
    rec = buun.wait_state("rpc", lambda r: r["state"] == "ready" and r["server"]["pid"] != old)
    assert rec["lost_workers"] == {} and rec["crashes"] == 1
    s = requests.Session()
    s.trust_env = False
    reply = s.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hello", "n_predict": 4}, timeout=60)
    assert reply.status_code == 200, reply.text

    # lost while idle: llama-server would only fail at the next request; its closed connection tells first
    again = rec["server"]["pid"]
    buun("worker", "stop", str(workers[0]), check=True)
    rec = buun.wait_state("rpc", lambda r: r["state"] == "backoff" and f"127.0.0.1:{workers[0]}" in r["lost_workers"])
    assert "closed its connection to llama-server" in rec["last_crash"]
    buun("worker", "start", "--port", str(workers[0]), check=True)
    buun.wait_state("rpc", lambda r: r["state"] == "ready" and r["server"]["pid"] != again)

    buun("stop", "rpc", check=True)
    buun("worker", "stop", "--all", check=True)
    assert_none_left(buun)


def test_a_frozen_worker_is_caught_by_the_stall_check(buun: Buun) -> None:
    """llama-server waits on a worker's reply without a timeout and keeps answering /health: the
    supervisor sees the request make no progress and relaunches it, so the client gets an error."""
    workers, port = start_workers(buun), free_port()
    buun.start("rpc", port, "--rpc", rpc_arg(workers), "--stall-timeout", "3", extra=TEST_FLAGS)
    old = buun.record("rpc")["server"]["pid"]
    frozen = json.loads((buun.state_dir / "workers" / str(workers[1]) / "state.json").read_text())["server"]["pid"]

    outcome: dict[str, object] = {}
    first = threading.Event()
    client = threading.Thread(target=_stream, args=(port, outcome, first), daemon=True)
    client.start()
    assert first.wait(30), "the request never started"
    os.kill(frozen, signal.SIGSTOP)
    try:
        client.join(40)
        print(f"the client, its worker frozen mid-request: {outcome}")
        assert not client.is_alive() and outcome["end"] not in ("complete", "ReadTimeout"), outcome
        rec = buun.wait_state("rpc", lambda r: "made no progress" in r["last_crash"])
        assert rec["crashes"] == 1
    finally:
        os.kill(frozen, signal.SIGCONT)
    buun.wait_state("rpc", lambda r: r["state"] == "ready" and r["server"]["pid"] != old)

    buun("stop", "rpc", check=True)
    buun("worker", "stop", "--all", check=True)
    assert_none_left(buun)
