"""The supervisor under what weeks of running meet: a full disk, its files deleted or damaged, a
terminal that goes away, commands that overlap. With a stand-in llama-server
(tests/support/fake_llama_server.py), so each case takes seconds; the real server's own lifecycle is in
test_server_lifecycle.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from buun_tool.server.process import free_port
from tests.support.fake_llama_server import write_fake_bin
from tests.support.fixtures_server import FAST, ROOT, processes_with_env, run_buun, wait_record


@dataclass
class Fake:
    state_dir: Path
    env: dict[str, str]
    models: list[Path]

    def __call__(self, *args: str, check: bool = False, env: dict[str, str] | None = None,
                 timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return run_buun(*args, env={**self.env, **(env or {})}, timeout=timeout, check=check)

    def launch_args(self, name: str, port: int, *options: str) -> list[str]:
        return ["--name", name, "--port", str(port), "--model", str(self.models[0]),
                "--draft", str(self.models[1]), *FAST, *options]

    def start(self, name: str, port: int, *options: str, env: dict[str, str] | None = None) -> None:
        self("start", *self.launch_args(name, port, *options), check=True, env=env)

    def dir(self, name: str) -> Path:
        return self.state_dir / "instances" / name

    def record(self, name: str) -> dict:
        return json.loads((self.dir(name) / "state.json").read_text())

    def wait(self, name: str, cond: Callable[[dict], bool], timeout: float = 10) -> dict:
        return wait_record(lambda: self.record(name), cond, name, timeout)

    def ours(self) -> list[psutil.Process]:
        return processes_with_env("BUUN_STATE_DIR", str(self.state_dir))


@pytest.fixture
def fake(tmp_path: Path, isolated_dirs: Path) -> Iterator[Fake]:
    models = [tmp_path / "t.gguf", tmp_path / "d.gguf"]
    for m in models:
        m.write_bytes(b"GGUF")
    env = {**os.environ, "BUUN_LLAMA_BIN_DIR": str(write_fake_bin(tmp_path / "bin").parent)}
    f = Fake(isolated_dirs / "state", env, models)
    yield f
    left = [p for p in f.ours() if _alive(p)]  # a zombie has ended: only its parent's wait is due
    shown = [_cmdline(p) for p in left]
    for p in left:
        p.kill()
    assert not left, f"processes left: {shown}"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return [f"pid {p.pid} (ended)"]


def healthy(port: int) -> bool:
    s = requests.Session()
    s.trust_env = False
    try:
        return s.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def assert_none_left(f: Fake) -> None:
    deadline = time.monotonic() + 5
    while f.ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not f.ours(), [p.cmdline() for p in f.ours()]


def test_a_full_disk_neither_hangs_nor_ends_the_server(fake: Fake) -> None:
    """The log (and the record) cannot be written: llama-server keeps serving and is still
    relaunched after a crash; once writing works again the record catches up and the log says how
    many lines were lost. The output reader died on the first failed write, so llama-server hung on
    its next line of output, and the supervisor died with a traceback when it logged the hang,
    taking the server with it. A file-size limit on the supervisor stands in for the full disk."""
    port = free_port()
    fake.start("full", port, "--log-max-mb", "100", env={"FAKE_LLAMA_SPAM": "1"})
    rec = fake.record("full")
    sup = psutil.Process(rec["supervisor"]["pid"])
    sup.rlimit(psutil.RLIMIT_FSIZE, (1000, psutil.RLIM_INFINITY))  # the log is past it already, a record is longer
    time.sleep(2)  # a pipe's worth of output, many times over
    assert healthy(port) and sup.is_running()
    old = rec["server"]["pid"]
    psutil.Process(old).kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (healthy(port) and sup.children()
                                               and sup.children()[0].pid != old):
        time.sleep(0.1)
    assert healthy(port) and sup.children()[0].pid != old, "not relaunched while the disk was full"
    assert fake.record("full")["server"]["pid"] == old  # the record could not be written

    sup.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))
    # the record catches up in steps (the new pid while starting, then ready): wait for the last
    rec = fake.wait("full", lambda r: r["server"] and r["server"]["pid"] != old and r["state"] == "ready")
    assert rec["crashes"] == 1
    log = (fake.dir("full") / "server.log").read_text()
    assert "line(s) of output were lost: the log could not be written (File too large)" in log
    fake("stop", "full", check=True)
    assert_none_left(fake)


def test_status_says_a_record_its_supervisor_could_not_write_is_stale(fake: Fake) -> None:
    """After a relaunch on a full disk, `buun status` showed the record as last written, 'ready,
    restarts 0', with no warning. The supervisor's failed writes now set the old record's
    modification time (which needs no free space), and the server it runs is not the one the
    record names: status says the record is stale and why, and shows the server that runs."""
    port = free_port()
    fake.start("behind", port)
    rec = fake.record("behind")
    sup = psutil.Process(rec["supervisor"]["pid"])
    sup.rlimit(psutil.RLIMIT_FSIZE, (100, psutil.RLIM_INFINITY))  # no record (nor log line) fits
    old = rec["server"]["pid"]
    psutil.Process(old).kill()
    deadline = time.monotonic() + 60  # the relaunch's wait: generous, as the loop ends when it is seen
    st: dict = {}
    while time.monotonic() < deadline:
        st = json.loads(fake("status", "behind", "--json", check=True).stdout)
        if st["record_behind"] and "does not name" in st["record_behind"] and "could not write" in st["record_behind"]:
            break
        time.sleep(0.3)
    new = sup.children()[0].pid
    assert new != old and fake.record("behind")["server"]["pid"] == old  # the record could not be written
    assert st["state"] == "ready" and st["restarts"] == 0, st  # what the record says ...
    behind = st["record_behind"] or ""
    assert "its supervisor could not write it since" in behind and "a full disk" in behind, st
    assert f"llama-server now runs as pid {new}" in behind and f"not pid {old}" in behind, st
    assert st["server_pid"] == new and st["health"] == "ok", st  # ... and the server that runs
    text = " ".join(fake("status", "behind", check=True).stdout.split())
    assert "ready (stale record: see below)" in text and "warning stale record, written at" in text, text
    assert f"pid {new} (supervisor {sup.pid})" in text, text

    sup.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))
    fake.wait("behind", lambda r: r["server"] and r["server"]["pid"] == new and r["state"] == "ready")
    time.sleep(2.5)  # past the lag status allows a record
    st = json.loads(fake("status", "behind", "--json", check=True).stdout)
    assert st["record_behind"] is None and st["restarts"] == 1 and st["server_pid"] == new, st
    fake("stop", "behind", check=True)
    assert_none_left(fake)


def test_stopping_what_is_stopped_is_done(fake: Fake) -> None:
    """`buun stop` (and `buun worker stop`) with nothing running exited 2 ("no instance exists
    yet", "more than one instance: name the one you mean"): a script's cleanup failed for a
    server that was already down. It says there is nothing to stop and succeeds; a name that is
    no instance stays an error (a typo)."""
    for args, said in ((("stop",), "no server instance is running: nothing to stop"),
                       (("worker", "stop"), "no worker is running: nothing to stop"),
                       (("stop", "--all"), "nothing to stop")):
        r = fake(*args)
        assert r.returncode == 0 and said in " ".join(r.stderr.split()), (args, r.stderr)
    fake.start("one", free_port())
    fake.start("two", free_port())
    r = fake("stop")
    assert r.returncode == 2 and "more than one instance" in r.stderr, r.stderr  # which one is meant?
    fake("stop", "--all", check=True)
    r = fake("stop")
    assert r.returncode == 0 and "nothing to stop" in r.stderr, r.stderr
    r = fake("stop", "one")
    assert r.returncode == 0 and "one: not running (stopped)" in r.stderr, r.stderr
    assert fake("stop", "ghost").returncode == 2
    assert_none_left(fake)


def test_a_damaged_record_is_written_again(fake: Fake) -> None:
    """A record cut short (a crash of the machine mid-write, a hand edit) made `buun status` say
    'stopped' while the server served, and `buun stop` fail ('locked but its supervisor is
    unknown') until the next change of state, which a ready server may not have for weeks."""
    port = free_port()
    fake.start("cut", port)
    state = fake.dir("cut") / "state.json"
    state.write_text(state.read_text()[:20])
    rec = fake.wait("cut", lambda r: r["state"] == "ready", timeout=5)
    st = json.loads(fake("status", "cut", "--json", check=True).stdout)
    assert st["state"] == "ready" and st["running"] and st["server_pid"] == rec["server"]["pid"]
    r = fake("stop", "cut", check=True)
    assert "cut: stopped" in r.stderr
    assert_none_left(fake)


def test_an_instance_folder_deleted_while_running_is_made_again(fake: Fake) -> None:
    """The folder removed (`rm -rf` of buun's state) while the server runs: the supervisor makes
    its lock, record, launch spec and log again. It went on unseen: `buun status` and `buun stop`
    knew no such instance, and a second `buun start` of the name took a new lock and ran beside it."""
    port = free_port()
    fake.start("gone", port)
    sup = fake.record("gone")["supervisor"]["pid"]
    d = fake.dir("gone")
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    fake.wait("gone", lambda r: r["state"] == "ready", timeout=5)
    deadline = time.monotonic() + 5
    while not (d / "lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    st = json.loads(fake("status", "gone", "--json", check=True).stdout)
    assert st["state"] == "ready" and st["running"] and st["supervisor"]["pid"] == sup
    r = fake("start", *fake.launch_args("gone", free_port()))
    assert r.returncode == 8 and "instance gone is already running" in " ".join(r.stderr.split()), r.stderr
    assert (d / "spec.json").exists()
    assert "was deleted while running; made again" in fake("logs", "gone", check=True).stdout
    fake("stop", "gone", check=True)
    assert_none_left(fake)


@pytest.mark.parametrize("deleted", ["lock", "folder"])
def test_a_deleted_lock_file_lets_no_second_supervisor_run(fake: Fake, deleted: str) -> None:
    """The lock file (or the instance folder) deleted under a running supervisor: a `buun start` of
    the name before the supervisor's next check made its files again took a new lock file and ran
    a second supervisor and server beside it. The supervisor is held stopped (SIGSTOP) meanwhile,
    so the start always comes in that window; the instance's guard refuses it."""
    import shutil

    port = free_port()
    fake.start("twin", port)
    rec = fake.record("twin")
    sup, server = psutil.Process(rec["supervisor"]["pid"]), rec["server"]["pid"]
    d = fake.dir("twin")
    sup.suspend()
    try:
        if deleted == "lock":
            (d / "lock").unlink()
            st = json.loads(fake("status", "twin", "--json", check=True).stdout)
            assert st["running"] and st["supervisor"]["pid"] == sup.pid, st
        else:
            shutil.rmtree(d)
        r = fake("start", *fake.launch_args("twin", free_port()))
        assert r.returncode == 8, (r.stdout, r.stderr)
        assert "instance twin is already running: its supervisor lives on" in " ".join(r.stderr.split())
    finally:
        sup.resume()
    assert {p.pid for p in fake.ours()} == {sup.pid, server}  # no second supervisor, no second server
    fake.wait("twin", lambda r: r["state"] == "ready" and r["server"]["pid"] == server and (d / "lock").exists())
    assert healthy(port)
    fake("stop", "twin", check=True)
    assert_none_left(fake)


def test_serve_stops_when_its_terminal_closes(fake: Fake) -> None:
    """`buun serve` in a terminal that closes (an SSH session dropped) gets SIGHUP, which also
    means `buun restart`: it relaunched llama-server, then died with a traceback at the first line
    it showed on the gone terminal, its record left 'stopping'. Now it stops in order."""
    import pty

    port = free_port()
    pid, fd = pty.fork()
    if pid == 0:  # a session on the new terminal, as a shell's foreground job
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "buun_tool", "serve", *fake.launch_args("tty", port)],
                  {**fake.env, "COLUMNS": "200"})
    try:
        fake.wait("tty", lambda r: r["state"] == "ready")
        server = fake.record("tty")["server"]["pid"]
    finally:
        os.close(fd)  # hang up: the kernel sends SIGHUP to the terminal's session
    deadline = time.monotonic() + 8
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"buun serve still runs after its terminal closed: {fake.record('tty')}")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    rec = fake.record("tty")
    assert rec["state"] == "stopped" and rec["restarts"] == 0
    assert not psutil.pid_exists(server)
    log = (fake.dir("tty") / "server.log").read_text()
    assert "stopping: the terminal closed" in log and "restart requested" not in log
    assert_none_left(fake)


def test_reading_an_instance_never_makes_a_start_fail(isolated_dirs: Path) -> None:
    """`buun status` (a monitoring script's, every few seconds) probes the instance lock. The probe
    took it exclusively for a moment, so a `buun start`, `stop` or `restart` at that moment was
    refused ('already being started or stopped by another buun', exit 8), and two probes at once
    saw each other as a running supervisor."""
    from buun_tool.server.instance import Instance

    inst = Instance("busy")
    inst.make_dir()
    probe = ("import time\nfrom buun_tool.server.instance import Instance\n"
             "end = time.monotonic() + 2\nwhile time.monotonic() < end: Instance('busy').is_locked()\n")
    probers = [subprocess.Popen([sys.executable, "-c", probe], cwd=ROOT) for _ in range(2)]
    refused = seen = tries = 0
    try:
        time.sleep(0.3)  # the probers' imports
        while any(p.poll() is None for p in probers):
            tries += 1
            seen += inst.is_locked()
            fd = inst.try_lock()
            if fd is None:
                refused += 1
            else:
                os.close(fd)
    finally:
        for p in probers:
            p.wait()
    assert tries > 100 and (refused, seen) == (0, 0), (tries, refused, seen)


def test_a_stop_while_another_cleans_up_waits_for_it(fake: Fake) -> None:
    """A second `buun stop` that came while the first held the lock to clean up after a
    supervisor that had died failed with 'locked but its supervisor is unknown' (exit 8), once the
    first had let go too. Here the test holds the lock, as that first stop does, for a second."""
    from buun_tool.server.instance import Instance

    inst = Instance("twice")
    inst.make_dir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (inst.dir / "state.json").write_text(json.dumps({
        "name": "twice", "run_id": "r", "state": "ready", "port": 1,
        "supervisor": {"pid": dead.pid, "create_time": time.time() - 5}}))
    fd = inst.try_lock()
    assert fd is not None
    try:
        stop = subprocess.Popen([sys.executable, "-m", "buun_tool", "stop", "twice"], cwd=ROOT, env=fake.env,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
    finally:
        os.close(fd)
    _, err = stop.communicate(timeout=20)
    assert stop.returncode == 0 and "twice: stopped (cleaned up" in " ".join(err.split()), err
    assert fake.record("twice")["state"] == "stopped"


def test_a_clock_set_back_does_not_delay_a_relaunch(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relaunch after a crash waited for the wall clock to reach its time: a clock set back an
    hour while the server was down (NTP stepping it, a VM resumed) kept it down for that hour.
    The supervisor runs in this process, so that its clock can be set back the moment it backs off."""
    import threading

    from buun_tool.server.instance import Instance
    from buun_tool.server.spec import LaunchSpec
    from buun_tool.server.supervisor import Supervisor

    port = free_port()
    fake.start("clock", port)  # a real launch's spec, then the supervisor run here
    fake("stop", "clock", check=True)
    inst = Instance("clock")
    spec_data = inst.read_spec()
    assert spec_data is not None
    events: list[str] = []
    real_time = time.time

    def listener(kind: str, message: str) -> None:
        events.append(kind)
        if kind == "ready" and events.count("ready") == 1:
            psutil.Process(sup.child.pid).kill()  # type: ignore[union-attr]
        if kind == "backoff":
            monkeypatch.setattr(time, "time", lambda: real_time() - 3600)

    fd = inst.try_lock()
    sup = Supervisor(LaunchSpec.from_json(spec_data), inst, None, listener, fd)
    thread = threading.Thread(target=sup.run)
    thread.start()
    try:
        deadline = real_time() + 6
        while events.count("ready") < 2 and real_time() < deadline:
            time.sleep(0.05)
        assert events.count("ready") == 2, events
    finally:
        sup.request_stop()
        thread.join(10)
        if fd is not None:
            os.close(fd)
    assert_none_left(fake)


def test_status_says_when_a_crashed_server_is_launched_again(fake: Fake) -> None:
    """Between a crash and the relaunch (--backoff, doubled per recent crash, up to a minute) the
    server is down: `buun status` said 'backoff' and why, not for how long. How long is left
    depends on how soon status runs (on busy cores: seconds), the time it names does not."""
    port = free_port()
    fake.start("down", port, "--backoff", "30", "--backoff-max", "30")
    psutil.Process(fake.record("down")["server"]["pid"]).kill()
    rec = fake.wait("down", lambda r: r["state"] == "backoff")
    text = " ".join(fake("status", "down", check=True).stdout.split())
    assert "backoff" in text and "last crash llama-server was killed by SIGKILL" in text
    left = re.search(r"relaunch in (\d+) s \(at (\d\d:\d\d:\d\d)\)", text)
    assert left, text
    assert left[2] == time.strftime("%H:%M:%S", time.localtime(rec["next_start_at"])), text
    assert 0 <= int(left[1]) <= 30 and rec["next_start_at"] - time.time() < 30.5, text
    fake("stop", "down", check=True)
    assert_none_left(fake)


def test_supervisor_log_is_rotated_as_the_server_log_is(fake: Fake) -> None:
    """supervisor.log (a detached supervisor's own output: each state change) was never rotated,
    so a supervisor that restarted a crashing server for months grew it without end. Now it is
    rotated by --log-max-mb/--log-keep, and the supervisor's stdout and stderr (a traceback) go to
    the current file, not to a rotated one that is deleted later."""
    port = free_port()
    fake.start("chatty", port, "--log-max-mb", "0.0004", "--log-keep", "1", "--max-crashes", "100",
               "--backoff", "0.05", "--backoff-max", "0.05")
    log = fake.dir("chatty") / "supervisor.log"
    for _ in range(6):  # each crash and relaunch writes ~250 bytes of state changes
        old = fake.record("chatty")["server"]["pid"]
        psutil.Process(old).kill()
        fake.wait("chatty", lambda r, old=old: r["state"] == "ready" and r["server"]["pid"] != old)
    limit = int(0.0004 * 2**20)
    rotated = sorted(p.name for p in log.parent.glob("supervisor.log*"))
    assert rotated == ["supervisor.log", "supervisor.log.1"], rotated
    assert all((log.parent / n).stat().st_size <= limit for n in rotated)
    sup = fake.record("chatty")["supervisor"]["pid"]
    assert {os.readlink(f"/proc/{sup}/fd/{fd}") for fd in (1, 2)} == {str(log)}
    from buun_tool.server import logfile

    # the record says ready before the supervisor's log line does: wait for the line
    deadline = time.monotonic() + 10
    while "ready: llama-server is ready" not in logfile.tail(log, 1)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "ready: llama-server is ready" in logfile.tail(log, 1)[0]
    fake("stop", "chatty", check=True)
    assert_none_left(fake)
