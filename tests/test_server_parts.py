"""The supervisor's parts on their own: /metrics parsing, log-line diagnosis, the rotating log,
nvidia-smi parsing, the state record and transitions, instance locks and stale PIDs, process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from buun_tool.base import nvidia
from buun_tool.base.errors import Exit
from buun_tool.server import logfile, loglines, metrics, process
from buun_tool.server.health import Health, Probe
from buun_tool.server.instance import Instance, live, ref_of
from buun_tool.server.state import TRANSITIONS, ProcRef, Record, State
from tests.support.fake_remote_server import forever, serve, status

# Shaped like server_task_result_metrics::to_metrics() of the pinned llama.cpp.
METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 17
llamacpp:tokens_predicted_total 160
llamacpp:tokens_predicted_seconds_total 2
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 300
llamacpp:spec_decode_num_accepted_tokens_total 120
llamacpp:spec_decode_num_drafts_total 20
llamacpp:requests_processing 0
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 18
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 12
"""


class TestMetrics:
    def test_parse(self) -> None:
        samples = metrics.parse(METRICS + "garbage line\nllamacpp:bad NaNx\n")
        assert samples[metrics.DRAFTS][()] == 20
        assert samples[metrics.PER_POS][(("position", "1"),)] == 12
        assert "garbage" not in samples

    def test_dflash_figures(self) -> None:
        s = metrics.dflash_stats(metrics.parse(METRICS))
        assert s is not None
        assert (s.drafts, s.drafted, s.accepted) == (20, 300, 120)
        assert s.acceptance_rate == pytest.approx(0.4)
        assert s.mean_accepted == pytest.approx(6.0)
        assert s.mean_acceptance_length == pytest.approx(7.0)  # accepted per step + the bonus token
        assert s.accepted_per_position == [18, 12, 7]
        assert s.tokens_per_second == pytest.approx(80.0)

    def test_delta_between_readings(self) -> None:
        """One request's share of the counters, as `buun bench` takes it."""
        before = metrics.dflash_stats(metrics.parse(METRICS))
        after = metrics.dflash_stats(metrics.parse(METRICS.replace(" 300", " 330").replace(" 120", " 132")
                                                   .replace(" 20\n", " 24\n").replace('"1"} 12', '"1"} 15')))
        d = metrics.delta(before, after)
        assert (d["drafted"], d["accepted"], d["steps"]) == (30, 12, 4)
        assert d["accepted_per_pos"] == [0, 3, 0]
        assert metrics.delta(None, after) == {}

    def test_counters_that_count_nothing(self) -> None:
        """Before: NaN or Infinity was a ValueError or OverflowError traceback (in `buun status`
        and `buun bench --url`), a negative count was taken as it is, and a position label of 5
        million made a list that long (of 10^11, the memory); position "²" passed isdigit() and
        was a ValueError traceback."""
        s = metrics.dflash_stats(metrics.parse(
            METRICS.replace(" 300", " NaN").replace(" 120", " +Inf").replace(" 160", " NaN")
            + 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="5000000"} 1\n'
            + 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} -4\n'
            + 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="²"} 1\n'))
        assert s is not None and (s.drafts, s.drafted, s.accepted) == (20, 0, 0)
        assert s.accepted_per_position == [18, 12, 7] and s.tokens_per_second is None
        assert metrics.dflash_stats(metrics.parse(
            "llamacpp:spec_decode_num_drafts_total -3\nllamacpp:spec_decode_num_draft_tokens_total NaN\n")) is None

    def test_a_counter_that_went_back_gives_no_share(self) -> None:
        """A server restarted between two readings: its request's share is unknown, not negative."""
        before = metrics.dflash_stats(metrics.parse(METRICS))
        after = metrics.dflash_stats(metrics.parse(METRICS.replace(" 20\n", " 4\n")))
        assert metrics.delta(before, after) == {}
        assert metrics.delta(before, before) == {"drafted": 0, "accepted": 0, "steps": 0, "accepted_per_pos": [0, 0, 0]}

    def test_no_drafts_yet_and_no_speculation(self) -> None:
        s = metrics.dflash_stats(metrics.parse("llamacpp:spec_decode_num_drafts_total 0\n"))
        assert s is not None and s.acceptance_rate is None and s.mean_acceptance_length is None
        assert metrics.dflash_stats(metrics.parse("llamacpp:prompt_tokens_total 1\n")) is None


class TestSlotStates:
    """`buun status` per slot, from /slots (each slot's `timings` is buun's patch 0026)."""

    BUSY = {"id": 0, "is_processing": True, "id_task": 12, "n_prompt_tokens": 1840,
            "timings": {"predicted_n": 230, "predicted_per_second": 41.25, "draft_n": 300, "draft_n_accepted": 213,
                        "draft_n_steps": 30}}
    IDLE = {"id": 1, "is_processing": False, "id_task": 9, "n_prompt_tokens": 500,
            "timings": {"predicted_n": 64, "predicted_per_second": 38.0}}  # AR, or nothing drafted
    UNUSED = {"id": 2, "is_processing": False}
    UPSTREAM = {"id": 3, "is_processing": True, "id_task": 4, "n_prompt_tokens": 10}  # no timings

    def test_each_slots_request(self) -> None:
        from buun_tool.server.health import slot_state

        busy = slot_state(self.BUSY)
        assert busy.busy and busy.acceptance_rate == pytest.approx(0.71)
        assert busy.mean_acceptance_length == pytest.approx(1 + 213 / 30)
        idle = slot_state(self.IDLE)
        assert not idle.busy and idle.acceptance_rate is None and idle.generated == 64
        assert slot_state(self.UNUSED).task is None
        assert slot_state(self.UPSTREAM).generated is None and slot_state(self.UPSTREAM).drafted == 0

    def test_fields_that_are_not_figures(self) -> None:
        """Before: a `timings` list, a string or NaN count was an AttributeError or ValueError
        traceback in `buun status`, and a string speed one in its line (format ".1f")."""
        from buun_tool.cli.server import _slot_line
        from buun_tool.server.health import slot_state

        odd = slot_state({"id": 0, "is_processing": True, "id_task": 3, "n_prompt_tokens": "many", "timings": [1]})
        assert (odd.task, odd.context_tokens, odd.generated, odd.drafted) == (3, None, None, 0)
        timings = {"predicted_n": float("nan"), "predicted_per_second": "fast", "draft_n": "x",
                   "draft_n_accepted": 10**400, "draft_n_steps": -2}
        bad = slot_state({"id": 1, "id_task": 4, "timings": timings})
        assert (bad.generated, bad.tokens_per_second, bad.drafted, bad.accepted) == (None, None, 0, 0)
        assert _slot_line(odd) == "busy: task 3" and _slot_line(bad) == "idle, last: task 4"

    def test_a_summary_of_odd_json(self) -> None:
        """/slots off, and /props's settings a list: before, an AttributeError traceback in `buun status`."""
        from buun_tool.server.health import slots_summary

        props = status(200, b'{"total_slots": 2, "default_generation_settings": [1]}')
        with serve(status(404), slots=status(501), props=props) as url:
            probe = Probe(url)
            try:
                summary = slots_summary(probe)
                assert summary is not None and summary.per_slot is None
                assert summary.to_json() == {"total": 2, "busy": None, "n_ctx": None, "source": "/props"}
            finally:
                probe.close()

    def test_the_status_lines(self) -> None:
        from buun_tool.cli.server import _slot_line
        from buun_tool.server.health import slot_state

        lines = [_slot_line(slot_state(s)) for s in (self.BUSY, self.IDLE, self.UNUSED, self.UPSTREAM)]
        assert lines == [
            "busy: task 12, 1840 tokens in context, 230 generated at 41.2 tok/s, 71% of 300 drafted accepted "
            "(AL 8.10)",
            "idle, last: task 9, 500 tokens in context, 64 generated at 38.0 tok/s",
            "idle, unused",
            "busy: task 4, 10 tokens in context",
        ]

    def test_the_status_json_keeps_its_shape(self) -> None:
        """The rows are typed (SlotsRow, DFlashStats, ServerMemory); `buun status --json` gives the
        objects it gave when they were dicts."""
        from buun_tool.server import control
        from buun_tool.server.health import SlotsRow, slot_state

        stats = metrics.DFlashStats(drafts=2, drafted=30, accepted=20, acceptance_rate=2 / 3, mean_accepted=10.0,
                                    mean_acceptance_length=11.0)
        mem = nvidia.ServerMemory(500, [{"index": 0, "used_mib": 700, "total_mib": 24576}], {"0": 500})
        slots = SlotsRow(total=1, busy=1, n_ctx=4096, source="/slots", per_slot=(slot_state(self.BUSY),))
        out = control.Probes("ok", slots, stats, mem).to_json()
        assert out["slots"] == {"total": 1, "busy": 1, "n_ctx": 4096, "source": "/slots",
                                "per_slot": [slot_state(self.BUSY).to_json()]}
        assert out["slots"]["per_slot"][0]["task"] == 12 and out["dflash"]["accepted"] == 20
        assert out["gpu"] == {"server_mib": 500, "gpus": [{"index": 0, "used_mib": 700, "total_mib": 24576}],
                              "server_by_gpu": {"0": 500}}
        keyed = control.Probes("ok", SlotsRow(error="needs the key"), None, None, dflash_error="needs the key")
        assert keyed.to_json()["slots"] == {"error": "needs the key"} == keyed.to_json()["dflash"]
        assert keyed.to_json()["gpu"] is None and keyed.to_json()["health"] == "ok"


def _in_time(seconds: float, call: Callable[[], Any]) -> Any:
    """call() on a thread, its result if it returns within `seconds`; the test fails (not hangs) if not."""
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"still waiting after {seconds} s"
    return done[0]


class TestProbe:
    """The probes read servers someone else may run (`buun bench --url` asks /health and /metrics):
    each ends within its timeout whatever the server sends, and never raises."""

    def test_a_body_without_end_or_trickled_is_given_up_on(self) -> None:
        """Before: requests' timeout is per read: /metrics sent without end, or /health a byte every
        0.1 s, held the probe (and a bench, which reads /metrics around every request) forever."""
        endless = forever(b"llamacpp:spec_decode_num_drafts_total 1\n", b"# more\n" * 4096)
        with serve(status(404), metrics=endless, health=forever(b"", b"{", pause=0.1)) as url:
            probe = Probe(url, timeout=1.0)
            try:
                start = time.monotonic()
                assert _in_time(5, lambda: probe.get_text("/metrics")) == (200, "")  # 16 MiB read: given up
                assert _in_time(5, probe.health) == Health(False, "timed out after 1 s")
                assert time.monotonic() - start < 4
            finally:
                probe.close()

    def test_json_that_is_not_json(self) -> None:
        with serve(status(404), slots=status(200, b"\xff["), props=status(200, b"[" * 100_000)) as url:
            probe = Probe(url)
            try:
                assert probe.get_json("/slots") == (200, None)
                assert probe.get_json("/props") == (200, None)  # nested past the stack
            finally:
                probe.close()


class TestLogLines:
    def test_phases_only_move_forward(self) -> None:
        assert loglines.phase_of("I srv    load_model: loading model '/x.gguf'") == "loading the target model"
        assert loglines.phase_of("I srv  llama_server: model loaded", "warming up") == "model loaded"
        assert loglines.phase_of("I srv    load_model: loading model '/x.gguf'", "model loaded") is None

    def test_unknown_flag_from_the_recipe_or_from_the_user(self) -> None:
        f = loglines.diagnose(["error: invalid argument: -cd"], recipe_flags=["-cd", "-c"])
        assert f is not None and f.kind == "bad-flag" and f.fatal and f.exit_code == Exit.USAGE
        assert "-cd" in f.message and "buun patch" in (f.hint or "")
        f = loglines.diagnose(["x", "error: invalid argument: --frobnicate"], recipe_flags=["-cd"])
        assert f is not None and "--frobnicate" in f.message and "after `--`" in (f.hint or "")

    def test_bad_value(self) -> None:
        f = loglines.diagnose(['error while handling argument "--draft-max": the argument has been removed. '
                               "use --spec-draft-n-max", "", "usage:"], recipe_flags=["--draft-max"])
        assert f is not None and f.kind == "bad-value"
        assert "--draft-max" in f.message and "has been removed" in f.message

    def test_out_of_memory_keeps_what_llama_printed(self) -> None:
        lines = ["load_tensors: loading model tensors",
                 "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: cudaMalloc failed: "
                 "out of memory", "llama_model_load: error loading model: unable to allocate CUDA0 buffer"]
        f = loglines.diagnose(lines)
        assert f is not None and f.kind == "oom"
        assert "8192.00 MiB" in f.message and "-ctk q8_0" in (f.hint or "") and "-c 4096" in (f.hint or "")

    def test_model_and_drafter_and_bind(self) -> None:
        f = loglines.diagnose(["E srv    load_model: failed to load model, '/x.gguf'"])
        assert f is not None and f.kind == "model" and "model" in f.message and f.exit_code == Exit.NOT_READY
        f = loglines.diagnose(["E srv    load_model: failed to load draft model, '/d.gguf'"])
        assert f is not None and "drafter" in f.message
        f = loglines.diagnose(["E srv  start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 80"])
        assert f is not None and f.kind == "bind" and f.exit_code == Exit.CONFLICT

    def test_normal_chatter_is_not_a_failure(self) -> None:
        chatter = ["E llama_init_from_model: failed to initialize the context: dflash requires ctx_other to be "
                   "set (this warning is normal during memory fitting)",
                   "W operator(): failed to measure the memory of the extra model, fitting without it"]
        assert loglines.diagnose(chatter) is None
        assert loglines.notable(chatter + ["GGML_ASSERT(x) failed", "CUDA error: an illegal memory access"]) == [
            "GGML_ASSERT(x) failed", "CUDA error: an illegal memory access"]

    def test_summary_puts_known_failure_lines_first(self) -> None:
        lines = [f"line {i}" for i in range(30)] + ["0.01.000.000 E GGML_ASSERT(ok) failed"] * 2 + ["end"]
        text = loglines.summary(lines, n_last=3)
        assert text.count("GGML_ASSERT(ok) failed") == 1 and "0.01.000.000" not in text  # once, prefix cut
        assert text.index("GGML_ASSERT") < text.index("other last lines") and "line 29" in text
        assert "line 27" not in text


class TestLogFile:
    def test_rotation_keeps_a_few(self, tmp_path: Path) -> None:
        log = logfile.RotatingLog(tmp_path / "server.log", max_bytes=100, keep=2)
        for i in range(40):
            log.write(f"line {i:02d} ........")  # 20 bytes a line: 5 lines a file
        log.close()
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["server.log", "server.log.1", "server.log.2"]
        assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())
        assert logfile.tail(tmp_path / "server.log", 7) == [f"line {i:02d} ........" for i in range(33, 40)]

    def test_follow_sees_new_lines_across_a_rotation(self, tmp_path: Path) -> None:
        path = tmp_path / "server.log"
        log = logfile.RotatingLog(path, max_bytes=60, keep=3)
        log.write("before follow")
        stop = threading.Event()
        seen: list[str] = []

        def reader() -> None:
            for line in logfile.follow(path, poll=0.02, stop=stop):
                seen.append(line)

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.2)
        for i in range(6):
            log.write(f"new line {i} ....")  # 18 bytes: rotates after 3
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while len(seen) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        t.join(5)
        log.close()
        assert seen == [f"new line {i} ...." for i in range(6)]

    def test_logs_show_control_characters_instead_of_sending_them(self, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
        """A client's text that llama-server logs (a warning quoting a request field) must not reach
        the terminal as escape sequences when the owner runs `buun logs`: clear the screen, set the
        title, erase with backspaces."""
        from buun_tool.cli.options import show_log

        path = tmp_path / "server.log"
        evil = "srv  warn: unsupported Responses tool type '\x1b[2J\x1b]0;owned\x07\x08\x08fake line\x9b1m' skipped"
        path.write_text("normal line\n" + evil + "\n")
        show_log(path, "instance x", 10, follow=False)
        out = capsys.readouterr().out
        assert out.splitlines() == [
            "normal line",
            "srv  warn: unsupported Responses tool type '\\x1b[2J\\x1b]0;owned\\x07\\x08\\x08fake line\\x9b1m' skipped"]
        assert not any(c in out for c in "\x1b\x07\x08\x9b")
        # an error or warning that quotes such a line (a crash's last lines) is shown the same way
        from buun_tool.base import console
        assert console.labelled("error:", "bold red", "died:\n  \x1b]0;owned\x07").plain == \
            "error: died:\n  \\x1b]0;owned\\x07"

    def test_status_shows_what_the_server_said_without_its_control_characters(self) -> None:
        """`buun status` quotes the server: its /health answer, a crash's message. Those are the
        server's words (a remote one's with --host), shown as text like the log."""
        from buun_tool.base import console
        from buun_tool.cli import server as server_cli
        from buun_tool.server import control

        r = Record("x", "run", State.READY, last_crash="exited: \x1b[2J\x1b[Hall good")
        st = control.InstanceStatus("x", State.READY, True, r,
                                    probes=control.Probes("ok \x1b]0;owned\x07", None, None, None))
        with console.out.capture() as cap:
            server_cli._print_status(st)
        out = cap.get()
        assert "\x1b" not in out and "\x07" not in out
        assert "exited: \\x1b[2J\\x1b[Hall good" in out and "ok \\x1b]0;owned\\x07" in out

    def test_a_workers_uptime_past_a_day_reads_in_days_as_a_servers_does(self) -> None:
        """Servers' and workers' `status` lines are one printer's (cli/options.py): a worker up for
        26 hours said "26h00m", a server "1d02h"."""
        from buun_tool.base import console
        from buun_tool.cli import server as server_cli
        from buun_tool.cli import worker as worker_cli
        from buun_tool.server import control
        from buun_tool.server import worker as worker_mod

        day = 26 * 3600 + 5
        with console.out.capture() as cap:
            worker_cli._print(worker_mod.WorkerStatus("w", State.READY, True, uptime_s=day))
            server_cli._print_status(control.InstanceStatus("x", State.READY, True, uptime_s=day))
        assert [line.split() for line in cap.get().splitlines() if "uptime" in line] == [["uptime", "1d02h"]] * 2


def test_gpu_parsing() -> None:
    assert nvidia.parse_apps("1234, 20100\n99, 10\nbad\n1234, 5\n") == {1234: 20105, 99: 10}
    assert nvidia.parse_gpus("0, 21000, 24576\n") == [{"index": 0, "used_mib": 21000, "total_mib": 24576}]


class TestState:
    def test_record_round_trip(self) -> None:
        r = Record(name="a", run_id="r", state=State.BACKOFF, server=ProcRef(5, 1.5), error={"message": "m"})
        again = Record.from_json(r.to_json())
        assert again == r and again.state is State.BACKOFF

    def test_no_way_out_of_failed_and_stopped_only_to_start(self) -> None:
        assert TRANSITIONS[State.FAILED] == frozenset()
        assert State.READY not in TRANSITIONS[State.STOPPED]
        assert all(s in TRANSITIONS for s in State)


class TestInstance:
    def test_lock_is_exclusive_between_open_files(self) -> None:
        inst = Instance("one")
        fd = inst.try_lock()
        assert fd is not None
        try:
            assert inst.try_lock() is None and inst.is_locked()
        finally:
            os.close(fd)
        assert not inst.is_locked()

    @pytest.mark.parametrize("umask", [0o000, 0o022])
    def test_state_spec_and_logs_are_private_whatever_the_umask(self, umask: int) -> None:
        """Folders 0700 and files 0600 (lock, state, spec, logs, a rotated log), also where an earlier
        version left them wider."""
        from buun_tool.base import paths

        old_dir = paths.instances_dir() / "one"
        old_dir.mkdir(parents=True, mode=0o755)
        (old_dir / "server.log").write_text("old\n")
        (old_dir / "server.log").chmod(0o644)
        before = os.umask(umask)
        try:
            inst = Instance("one")
            fd = inst.try_lock()
            assert fd is not None
            os.close(fd)
            inst.write(Record(name="one", run_id="r"))
            inst.write_spec({"name": "one"})
            log = logfile.RotatingLog(inst.log_file, max_bytes=10, keep=1)
            log.write("a line longer than ten bytes")
            log.write("another one, so the first is rotated")
            log.close()
        finally:
            os.umask(before)
        for d in (paths.state_dir(), paths.instances_dir(), inst.dir):
            assert oct(d.stat().st_mode & 0o777) == oct(0o700), d
        files = sorted(inst.dir.iterdir())
        assert [f.name for f in files] == ["lock", "server.log", "server.log.1", "spec.json", "state.json"]
        for f in files:
            assert oct(f.stat().st_mode & 0o777) == oct(0o600), f

    def test_bad_names(self) -> None:
        from buun_tool.base.errors import UsageError

        for bad in ("", "../x", "a b", "-x"):
            with pytest.raises(UsageError):
                Instance(bad)

    def test_reused_pid_is_not_ours(self) -> None:
        me = ref_of(os.getpid())
        assert live(me) is not None
        assert live(ProcRef(me.pid, me.create_time - 100)) is None  # same PID, another start time
        assert live(me, "llama-server") is None  # same process, not the program named
        assert live(ProcRef(2**22 + 12345, 0.0)) is None


class TestProcess:
    def test_stop_group_kills_children_that_ignore_sigterm(self) -> None:
        # a parent that ignores SIGTERM with a child that ignores it too: both need SIGKILL
        code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen([sys.executable, '-c', 'import signal,time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); print('up', flush=True); "
                "time.sleep(60)")
        p = process.spawn([sys.executable, "-c", code], dict(os.environ), stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        members = psutil.Process(p.pid).children() + [psutil.Process(p.pid)]
        t0 = time.monotonic()
        assert process.stop_group(p.pid, grace=0.5, child=p) == "killed"
        assert time.monotonic() - t0 < 5
        assert not any(m.is_running() and m.status() != psutil.STATUS_ZOMBIE for m in members)

    def test_child_dies_with_its_parent(self) -> None:
        # a middle process spawns a sleeper via process.spawn, then is SIGKILLed
        code = ("import os, time; from buun_tool.server import process; "
                "p = process.spawn(['sleep', '60'], dict(os.environ), stdout=None); print(p.pid, flush=True); "
                "time.sleep(60)")
        mid = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parent.parent)
        assert mid.stdout is not None
        sleeper = psutil.Process(int(mid.stdout.readline()))
        mid.send_signal(signal.SIGKILL)
        mid.wait()
        sleeper.wait(5)  # raises TimeoutExpired if the death signal did not come
        assert not sleeper.is_running()

    def test_port_holder_names_the_process(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            assert not process.port_free("127.0.0.1", port)
            holder = process.port_holder(port)
            assert holder is not None and holder.pid == os.getpid()
            assert f"pid {os.getpid()}" in holder.describe()
        assert process.port_free("127.0.0.1", port)

    def test_exit_reason(self) -> None:
        assert process.exit_reason(-9) == "was killed by SIGKILL"
        assert process.exit_reason(1) == "exited with code 1"


def test_a_folder_no_instance_can_be_named_is_neither_a_server_nor_a_worker() -> None:
    # `buun status` and `buun worker status` list what their roots hold: a stray folder (a name
    # check_name refuses) is skipped by both, not an error that ends the listing
    from buun_tool.server.instance import all_instances
    from buun_tool.server.worker import WorkerInstance, all_workers

    for root, kind in ((Instance.root(), Instance), (WorkerInstance.root(), WorkerInstance)):
        (root / ".stray").mkdir(parents=True)
        (root / "kept").mkdir()
        assert [i.name for i in (all_instances() if kind is Instance else all_workers())] == ["kept"]
