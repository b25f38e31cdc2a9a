"""The server lifecycle with real processes: the CPU build's llama-server, a tiny random-weight
Qwen3.5 target + DFlash drafter pair, `buun` run as a subprocess, free ports. Every test ends
with no process of its own left (the `buun` fixture kills leftovers even when a test fails)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from buun_tool.server.process import free_port
from tests.support.fixtures_server import TEST_FLAGS, Buun, chat

pytestmark = pytest.mark.slow


def server_pid(b: Buun, name: str) -> int:
    return b.record(name)["server"]["pid"]


def kill_server_and_wait_ready(b: Buun, name: str) -> int:
    old = server_pid(b, name)
    os.kill(old, signal.SIGKILL)
    rec = b.wait_state(name, lambda r: r["state"] == "ready" and r["server"] and r["server"]["pid"] != old)
    return rec["server"]["pid"]


def assert_none_left(b: Buun) -> None:
    deadline = time.monotonic() + 5
    while b.ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = b.ours()
    assert not left, f"processes left: {[(p.pid, p.cmdline()) for p in left]}"


def test_start_chat_crash_restart_stop(buun: Buun) -> None:
    port = free_port()
    r = buun.start("main", port, extra=TEST_FLAGS)
    assert f"ready: http://127.0.0.1:{port}" in " ".join(r.stderr.split())
    rec = buun.record("main")
    assert rec["state"] == "ready" and rec["port"] == port and rec["restarts"] == 0
    assert "--metrics" in rec["command"] and rec["command"][rec["command"].index("--port") + 1] == str(port)

    reply = chat(port)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] > 0
    assert body["timings"]["draft_n"] > 0  # the DFlash drafter took part
    s = requests.Session()
    s.trust_env = False
    models = s.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["qwen3.5-27b-dflash"]  # the recipe's name, not the GGUF's path

    with chat(port, stream=True) as stream:
        assert stream.status_code == 200
        events = [ln for ln in stream.iter_lines(decode_unicode=True) if ln.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) >= 1

    status = buun.status("main")
    assert status["state"] == "ready" and status["health"] == "ok" and status["endpoint"].endswith(f":{port}")
    assert status["slots"]["total"] == 1 and status["slots"]["source"] == "/slots"
    fl = status["dflash"]
    assert fl["drafts"] > 0 and fl["drafted"] >= fl["accepted"] >= 0
    assert fl["mean_acceptance_length"] == pytest.approx(1 + fl["accepted"] / fl["drafts"])
    assert status["model_files"]["target"] == str(buun.pair[0])

    first_supervisor = rec["supervisor"]["pid"]
    new_pid = kill_server_and_wait_ready(buun, "main")
    rec = buun.record("main")
    assert rec["restarts"] == 1 and rec["crashes"] == 1 and "SIGKILL" in rec["last_crash"]
    assert rec["supervisor"]["pid"] == first_supervisor
    assert chat(port).status_code == 200

    r = buun("stop", "main", check=True)
    assert "main: stopped" in r.stderr
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == psutil.STATUS_ZOMBIE
    assert buun.record("main")["state"] == "stopped"
    assert_none_left(buun)
    assert buun("status", "main", "--json", check=True) and buun.status("main")["running"] is False


def test_a_stale_build_serves_with_a_warning(buun: Buun, llama_bin: Path, tmp_path: Path) -> None:
    """A build the patched source moved past (what `buun doctor` calls stale) still serves, with one
    line saying so and what rebuilds it; it started without a word. A current build says nothing."""
    from buun_tool.pipeline import build

    builds = tmp_path / "build"
    (builds / "cpu" / "bin").mkdir(parents=True)
    for f in llama_bin.iterdir():  # the CPU build's binaries under a stamp of this test's own
        (builds / "cpu" / "bin" / f.name).symlink_to(f)
    stamp = json.loads((llama_bin.parent / build.STAMP).read_text())
    env = {"BUUN_BUILD_DIR": str(builds)}
    warning = "the cpu build of llama.cpp is older than the patched source or its settings"
    for source, stale in ((stamp["source"], False), ({**stamp["source"], "tree": "0" * 40}, True)):
        (builds / "cpu" / build.STAMP).write_text(json.dumps({**stamp, "source": source}))
        r = buun("start", *buun.launch_args("old", free_port(), extra=TEST_FLAGS), env=env, check=True)
        text = " ".join(r.stderr.split())
        assert (warning in text) == stale and "ready" in text, text
        if stale:
            assert "(changed since the cpu build: the patched source tree)" in text and "`buun build --cpu`" in text
            assert buun.record("old")["command"][0] == str(builds / "cpu" / "bin" / "llama-server")
        buun("stop", "old", check=True)
    assert_none_left(buun)


def test_a_host_of_another_machine_is_named(buun: Buun) -> None:
    """An address no interface here has is not "a port in use by another program"."""
    r = buun.start("far", free_port(), "--host", "10.255.254.253", "--no-api-key", check=False)
    assert r.returncode == 2, r.stderr
    text = " ".join(r.stderr.split())
    assert "--host 10.255.254.253 is not an address of this machine" in text and "in use" not in text
    assert_none_left(buun)


def test_port_in_use_names_the_holder(buun: Buun) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = buun.start("busy", port, check=False)
    assert r.returncode == 8, r.stderr
    text = " ".join(r.stderr.split())
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in text and "--port" in text
    assert_none_left(buun)
    # refused before anything ran: no instance "busy" is left for status to list as stopped, nor for
    # `buun logs` / `buun stop` without a name to trip on ("more than one instance")
    assert not (buun.state_dir / "instances" / "busy").exists()
    r = buun("status")
    assert r.returncode == 0 and "busy" not in r.stdout + r.stderr and "no server instances" in r.stderr, r.stderr


def test_port_taken_by_another_instance_names_it(buun: Buun) -> None:
    port = free_port()
    buun.start("first", port, extra=TEST_FLAGS)
    r = buun.start("second", port, check=False)
    assert r.returncode == 8 and "buun instance first" in " ".join(r.stderr.split())
    buun("stop", "--all", check=True)
    assert_none_left(buun)


def test_missing_and_broken_model(buun: Buun, tmp_path: Path) -> None:
    r = buun("start", "--name", "m", "--port", str(free_port()), "--model", str(tmp_path / "nope.gguf"),
             "--draft", str(buun.pair[1]))
    assert r.returncode == 3 and "nope.gguf does not exist" in " ".join(r.stderr.split())
    assert "buun pull" in r.stderr

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(256))
    args = buun.launch_args("m", free_port(), extra=TEST_FLAGS)
    args[args.index("--model") + 1] = str(broken)
    r = buun("start", *args)
    text = " ".join(r.stderr.split())
    assert r.returncode == 3, r.stderr
    assert "could not load the model" in text and "buun convert" in text
    assert buun.record("m")["state"] == "failed"
    assert_none_left(buun)


def test_unknown_flag_is_named(buun: Buun) -> None:
    r = buun.start("flags", free_port(), extra=("--no-such-flag", "3"), check=False)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert "llama-server does not know the flag --no-such-flag" in text and "after `--`" in text
    assert_none_left(buun)


def test_recipe_flag_unknown_to_the_build_points_to_the_patch(buun: Buun, isolated_dirs: Path) -> None:
    # a user recipe (config dir) with a flag this llama-server lacks, as an unpatched build lacks -cd
    from buun_tool.formats import recipes

    text = recipes.available()["qwen3.5-27b-dflash"].read_text()
    assert "    --jinja: true\n" in text
    user = isolated_dirs / "config" / "recipes" / "odd.yaml"
    user.parent.mkdir(parents=True)
    user.write_text(text.replace("name: qwen3.5-27b-dflash", "name: odd")
                    .replace("    --jinja: true\n", "    --jinja: true\n    --buun-test-unknown: 1\n"))
    r = buun("start", "odd", *buun.launch_args("odd", free_port(), extra=TEST_FLAGS))
    text = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert "does not know the flag --buun-test-unknown" in text and "comes from the recipe" in text
    assert "buun patch" in text and "--drop --buun-test-unknown" in text
    assert_none_left(buun)


def test_crash_loop_stops_after_the_limit(buun: Buun) -> None:
    port = free_port()
    buun.start("loop", port, "--max-crashes", "3", "--crash-window", "60", extra=TEST_FLAGS)
    kill_server_and_wait_ready(buun, "loop")
    kill_server_and_wait_ready(buun, "loop")
    os.kill(server_pid(buun, "loop"), signal.SIGKILL)
    rec = buun.wait_state("loop", lambda r: r["state"] == "failed")
    msg = rec["error"]["message"]
    assert "crashed 3 times within 60 s" in msg and "stopped restarting" in msg and "SIGKILL" in msg
    assert "last lines:" in msg
    assert rec["crashes"] == 3 and rec["restarts"] == 2
    assert_none_left(buun)  # the supervisor gave up and exited
    status = buun.status("loop")
    assert status["state"] == "failed" and status["running"] is False


def test_two_concurrent_starts_one_wins(buun: Buun) -> None:
    port = free_port()
    args = ["start", *buun.launch_args("race", port, extra=TEST_FLAGS)]
    procs = [buun.popen(*args) for _ in range(2)]
    results = [(p.wait(60), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 8], results
    loser = next(err for code, err in results if code == 8)
    assert "instance race is already" in " ".join(loser.split())
    supervisors = [p for p in buun.ours() if "buun_tool.server.supervisor" in " ".join(p.cmdline())]
    servers = [p for p in buun.ours() if "llama-server" in p.name()]
    assert len(supervisors) == 1 and len(servers) == 1
    buun("stop", "race", check=True)
    assert_none_left(buun)


def test_stop_with_a_stale_pid_file(buun: Buun) -> None:
    # a record left by a supervisor that died, whose PIDs now belong to other programs
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        ct = psutil.Process(bystander.pid).create_time()
        d = buun.state_dir / "instances" / "stale"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({
            "name": "stale", "run_id": "old", "state": "ready", "port": 1,
            "supervisor": {"pid": bystander.pid, "create_time": ct - 1000},  # PID reused
            "server": {"pid": bystander.pid, "create_time": ct},  # alive, but not a llama-server
        }))
        status = buun.status("stale")
        assert status["state"] == "stopped" and status["stale"] is True and status["server_pid"] is None
        r = buun("stop", "stale", check=True)
        assert "cleaned up after a supervisor that had died" in " ".join(r.stderr.split())
        assert bystander.poll() is None  # never touch a process that is not ours
        assert buun.record("stale")["state"] == "stopped"
        r = buun("stop", "stale", check=True)
        assert "not running" in r.stderr
    finally:
        bystander.kill()
        bystander.wait()


def test_supervisor_killed_takes_the_server_with_it(buun: Buun) -> None:
    port = free_port()
    buun.start("orphan", port, extra=TEST_FLAGS)
    rec = buun.record("orphan")
    server = psutil.Process(rec["server"]["pid"])
    os.kill(rec["supervisor"]["pid"], signal.SIGKILL)
    server.wait(5)  # PR_SET_PDEATHSIG: raises TimeoutExpired if the server outlived its supervisor
    assert buun.status("orphan")["stale"] is True
    r = buun("stop", "orphan", check=True)
    assert "cleaned up" in r.stderr
    assert_none_left(buun)


def test_stop_kills_a_stuck_supervisor_and_its_server(buun: Buun) -> None:
    buun.start("stuck", free_port(), extra=TEST_FLAGS)
    rec = buun.record("stuck")
    os.kill(rec["supervisor"]["pid"], signal.SIGSTOP)  # it can no longer answer SIGTERM
    r = buun("stop", "stuck", "--timeout", "0.5", check=True)
    assert "did not answer SIGTERM" in " ".join(r.stderr.split())
    assert buun.record("stuck")["state"] == "stopped"
    assert_none_left(buun)


def test_survives_three_kills_and_reports_three_restarts(buun: Buun) -> None:
    port = free_port()
    buun.start("tough", port, extra=TEST_FLAGS)
    supervisor = buun.record("tough")["supervisor"]["pid"]
    pids = {server_pid(buun, "tough")}
    for _ in range(3):
        pids.add(kill_server_and_wait_ready(buun, "tough"))
    assert len(pids) == 4
    status = buun.status("tough")
    assert status["state"] == "ready" and status["restarts"] == 3 and status["crashes"] == 3
    assert status["supervisor"]["pid"] == supervisor and status["running"] is True
    assert chat(port).status_code == 200
    buun("stop", "tough", check=True)
    assert_none_left(buun)


def test_hung_server_is_restarted(buun: Buun) -> None:
    port = free_port()
    buun.start("hang", port, "--health-failures", "2", extra=TEST_FLAGS)
    old = server_pid(buun, "hang")
    os.kill(old, signal.SIGSTOP)  # alive but answering nothing
    rec = buun.wait_state("hang", lambda r: r["state"] == "ready" and r["server"]["pid"] != old, timeout=30)
    assert "stopped answering /health" in rec["last_crash"] and rec["restarts"] == 1
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
    buun("stop", "hang", check=True)
    assert_none_left(buun)


def test_status_answers_at_once_while_the_server_hangs(buun: Buun) -> None:
    from buun_tool.server.control import STATUS_PROBE_TIMEOUT_S

    port = free_port()
    buun.start("slow", port, "--health-failures", "1000", extra=TEST_FLAGS)  # the supervisor waits long
    pid = server_pid(buun, "slow")
    os.kill(pid, signal.SIGSTOP)  # its socket still accepts; nothing answers
    try:
        rec = buun.wait_state("slow", lambda r: bool(r.get("unresponsive_since")) and r["health_fails"] >= 2)
        assert rec["state"] == "ready" and rec["server"]["pid"] == pid
        t0 = time.monotonic()
        text = buun("status", "slow", check=True).stdout
        took = time.monotonic() - t0
        assert f"timed out after {STATUS_PROBE_TIMEOUT_S:g} s" in text
        assert "unresponsive since" in text and "the supervisor relaunches it at 1000" in text
        d = buun.status("slow")
        assert d["probe_timeout_s"] == STATUS_PROBE_TIMEOUT_S == 0.8
        assert d["health"] == "timed out after 0.8 s" and d["unresponsive_since"] == rec["unresponsive_since"]
        assert took < 10, took  # a sanity bound only (the whole CLI, imports included, on a busy box)
        # the context in use, and why (no GPU here: buun's default; on a GPU, what fits it)
        assert str(d["context"]["value"]) == rec["command"][rec["command"].index("-c") + 1]
        assert f"context    {d['context']['value']} ({d['context']['why']})" in text
    finally:
        os.kill(pid, signal.SIGCONT)
    rec = buun.wait_state("slow", lambda r: r.get("unresponsive_since") is None and r["health_fails"] == 0)
    assert rec["server"]["pid"] == pid  # it answers again: the same server, never relaunched
    buun("stop", "slow", check=True)
    assert_none_left(buun)


def test_restart_command(buun: Buun) -> None:
    port = free_port()
    buun.start("re", port, extra=TEST_FLAGS)
    old = server_pid(buun, "re")
    r = buun("restart", "re", check=True)
    assert "ready again" in r.stderr
    rec = buun.record("re")
    assert rec["server"]["pid"] != old and rec["restarts"] == 1 and rec["crashes"] == 0
    buun("stop", "re", check=True)
    buun("restart", "re", check=True)  # a stopped instance starts again from its saved spec
    assert buun.record("re")["state"] == "ready"
    assert chat(port).status_code == 200
    buun("stop", "re", check=True)
    assert_none_left(buun)


def test_foreground_serve_stops_on_ctrl_c(buun: Buun) -> None:
    port = free_port()
    p = buun.popen("serve", *buun.launch_args("fg", port, extra=TEST_FLAGS))
    try:
        buun.wait_state("fg", lambda r: r["state"] == "ready")
        assert chat(port).status_code == 200
        p.send_signal(signal.SIGINT)
        assert p.wait(20) == 0
        err = " ".join((p.stderr.read() if p.stderr else "").split())
        assert "ready:" in err and "stopped" in err
    finally:
        p.kill()
    assert buun.record("fg")["state"] == "stopped"
    assert_none_left(buun)


def test_two_instances_side_by_side_and_logs(buun: Buun) -> None:
    a, b = free_port(), free_port()
    buun.start("a", a, extra=TEST_FLAGS)
    buun.start("b", b, extra=TEST_FLAGS)
    assert chat(a).status_code == 200 and chat(b).status_code == 200
    listing = json.loads(buun("status", "--json", check=True).stdout)
    assert {d["name"]: d["state"] for d in listing} == {"a": "ready", "b": "ready"}
    log = (buun.state_dir / "instances" / "a" / "server.log").read_text().splitlines()
    assert buun("logs", "a", "-n", "3", check=True).stdout.splitlines() == log[-3:]
    everything = buun("logs", "a", "-n", "100000", check=True).stdout.splitlines()
    assert everything == log and any(ln.startswith("[buun]") and "ready:" in ln for ln in everything)
    assert not any("port" in ln and str(b) in ln for ln in everything)  # b's output is in b's log
    r = buun("stop")  # two running: which one?
    assert r.returncode == 2 and "instances: a, b" in " ".join(r.stderr.split())
    buun("stop", "--all", check=True)
    assert_none_left(buun)


@pytest.mark.parametrize("given_in", ["command line", "recipe"])
def test_api_key_is_required_and_never_stored(buun: Buun, isolated_dirs: Path, given_in: str) -> None:
    """The key (and a recipe's Hub token) reach llama-server through its environment only; every
    file of the instance is private (0600 in a 0700 folder)."""
    port = free_port()
    key, token = "k-" + os.urandom(8).hex(), "hf_" + os.urandom(8).hex()
    if given_in == "command line":
        buun.start("secure", port, "--api-key", key, extra=TEST_FLAGS)
    else:
        from buun_tool.formats import recipes

        text = recipes.available()["qwen3.5-27b-dflash"].read_text()
        user = isolated_dirs / "config" / "recipes" / "keyed.yaml"
        user.parent.mkdir(parents=True)
        user.write_text(text.replace("    --jinja: true\n", f"    --jinja: true\n    --api-key: {key}\n"
                                     f"    -hft: {token}\n"))
        buun("start", "keyed", *buun.launch_args("secure", port, extra=TEST_FLAGS), check=True)
    assert chat(port).status_code == 401
    assert chat(port, api_key=key).status_code == 200
    inst = buun.state_dir / "instances" / "secure"
    for f in inst.iterdir():
        assert key not in f.read_text(errors="replace") and token not in f.read_text(errors="replace"), f
    for p in buun.ours():
        assert key not in " ".join(p.cmdline()) and token not in " ".join(p.cmdline())
    server = psutil.Process(buun.record("secure")["server"]["pid"])
    assert server.environ()["LLAMA_API_KEY"] == key
    if given_in == "recipe":
        assert server.environ()["HF_TOKEN"] == token
    assert inst.stat().st_mode & 0o777 == 0o700
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in inst.iterdir()} == {
        n: oct(0o600) for n in ("lock", "state.json", "spec.json", "server.log", "supervisor.log")}
    assert buun.status("secure")["dflash"] == {"error": "needs the API key (--api-key or BUUN_API_KEY)"}
    status = buun.status("secure", env={"BUUN_API_KEY": key})
    assert status["dflash"]["drafts"] > 0
    buun("stop", "secure", check=True)
    # the key is not stored, so a restart without it is refused: it served without one on loopback
    r = buun("restart", "secure")
    assert r.returncode == 2 and "was started with an API key" in " ".join(r.stderr.split()), r.stderr
    assert_none_left(buun)


def test_binds_loopback_and_reads_slots_from_props_without_slots_endpoint(buun: Buun) -> None:
    port = free_port()
    buun.start("local", port, extra=(*TEST_FLAGS, "--no-slots"))
    s = requests.Session()
    s.trust_env = False
    assert s.get(f"http://127.0.0.1:{port}/health", timeout=5).json() == {"status": "ok"}
    listening = [c for c in psutil.net_connections("inet") if c.laddr and c.laddr.port == port
                 and c.status == psutil.CONN_LISTEN]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    slots = buun.status("local")["slots"]
    assert slots["source"] == "/props" and slots["total"] == 1 and slots["n_ctx"] > 0
    buun("stop", "local", check=True)
    assert_none_left(buun)


def test_slot_saves_are_private(buun: Buun, tmp_path: Path) -> None:
    """A slot save (`-- --slot-save-path DIR/`) holds a conversation's cached state, and the
    drafter's beside it: llama-server made both with the umask's mode, 0644 under the usual 022,
    readable by every user of the machine. buun's server runs under umask 077: 0600, as buun's own
    state files are."""
    saves = tmp_path / "saves"
    saves.mkdir()
    port = free_port()
    old = os.umask(0o022)  # the usual one, which buun inherits
    try:
        buun.start("saves", port, extra=(*TEST_FLAGS, "--slot-save-path", f"{saves}/"))
    finally:
        os.umask(old)
    assert chat(port).status_code == 200
    s = requests.Session()
    s.trust_env = False
    r = s.post(f"http://127.0.0.1:{port}/slots/0?action=save", json={"filename": "talk.bin"}, timeout=30)
    assert r.status_code == 200 and r.json()["n_saved"] > 0, r.text
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in saves.iterdir()}
    assert modes == {"talk.bin": "0o600", "talk.bin.draft": "0o600"}, modes
    buun("stop", "saves", check=True)
    assert_none_left(buun)


def test_commands_on_an_unknown_instance(buun: Buun) -> None:
    for cmd in ("stop", "status", "logs", "restart"):
        r = buun(cmd, "ghost")
        assert r.returncode == 2 and "no instance named ghost" in r.stderr, (cmd, r.stderr)


def test_supervisor_module_refuses_without_spec(buun: Buun) -> None:
    r = subprocess.run([sys.executable, "-m", "buun_tool.server.supervisor", "nothing", "--lock-fd", "99"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 3 and "no launch spec" in r.stderr


def test_status_shows_each_slot(buun: Buun) -> None:
    """`buun start --slots 2`: llama-server runs two slots, and `buun status` gives each one's state
    and its last request's figures (patch 0026's /slots timings)."""
    port = free_port()
    buun.start("team", port, "--slots", "2", extra=TEST_FLAGS)
    assert buun.record("team")["command"][buun.record("team")["command"].index("-np") + 1] == "2"
    session = requests.Session()
    session.trust_env = False  # the server is on this machine, whatever proxy the environment names
    for slot in (0, 1):
        r = session.post(f"http://127.0.0.1:{port}/completion", timeout=60, json={
            "prompt": "Hello", "n_predict": 8, "temperature": 0, "ignore_eos": True, "id_slot": slot})
        assert r.status_code == 200, r.text
    slots = buun.status("team")["slots"]
    assert slots["total"] == 2 and [s["id"] for s in slots["per_slot"]] == [0, 1]
    for s in slots["per_slot"]:
        assert not s["busy"] and s["task"] is not None and s["generated"] == 8 and s["drafted"] > 0
    shown = buun("status", "team", check=True).stdout
    assert "slot 0" in shown and "slot 1" in shown and "idle, last: task" in shown
    buun("stop", "team", check=True)
