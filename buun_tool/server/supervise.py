"""The supervisor: one loop that launches llama-server, waits for it to be ready, watches it,
restarts it after a crash or a hang (with exponential backoff, up to a crash-loop limit) and
stops it.

Every state change happens in `run()`'s loop, on the main thread. Signal handlers and the
output reader only put events on a queue, so nothing checks a state in one place and acts on it
in another. Before the first `ready`, any failure is final and reported with its own cause
(bad flag, missing memory, port taken, no progress): retrying a launch that never worked only
delays the error. After it, a failure is a crash, and the server is launched again.

With RPC workers (`--rpc`), a launch waits for every worker to answer (final before the first
ready, as above), and a crash, or a worker's end of llama-server's connection closing while it
runs, is reported as the lost worker with the next step (rpc.py); the server is launched again
once the worker answers, and waiting for it counts as no crash.

The same loop runs an RPC worker (worker.py's WorkerSupervisor): the hooks below
(`_new_record`, `_ready_probe`, `_health`, `_diagnose`, `_env`) are where the two differ.

The process that runs it detached, or for a systemd unit, is supervisor.py's `main`.

The parts beside the loop: the instance's files it keeps (supervise_files.py), its signals
(supervise_signals.py), its RPC workers' messages and stalls (supervise_workers.py), and the
listeners of a detached supervisor (supervise_report.py). Their public names are importable from
here too (supervise.Listener, supervise.report, supervise.detached_output).
"""

from __future__ import annotations

import collections
import os
import queue
import shlex
import subprocess
import threading
import time
from typing import IO, Any

from buun_tool.base.errors import BuunError, Exit
from buun_tool.server import addresses, loglines, process, rpc, supervise_signals
from buun_tool.server.health import Health, Probe
from buun_tool.server.instance import Instance, ref_of
from buun_tool.server.logfile import RotatingLog
from buun_tool.server.spec import LaunchSpec
from buun_tool.server.state import TRANSITIONS, Record, State
from buun_tool.server.supervise_files import KeptFiles
from buun_tool.server.supervise_report import Listener, detached_output, report
from buun_tool.server.supervise_workers import StallWatch, note_lost, steps

__all__ = [
    # supervise_report.py
    "Listener", "report", "detached_output",
    # the loop's own
    "TICK", "READY_PROBE_EVERY", "EOF_WAIT", "WORKER_RETRY", "WATCH_EVERY", "Supervisor", "spec_command",
]

TICK = 0.1  # seconds the loop waits for an event before its periodic checks
READY_PROBE_EVERY = 0.2
EOF_WAIT = 3.0  # after the child exits, how long to wait for its last lines
WORKER_RETRY = 1.0  # seconds between probes of a lost RPC worker
WATCH_EVERY = 1.0  # seconds between checks of the instance's files (a record not written yet, ...)


class Supervisor:
    def __init__(self, spec: LaunchSpec, instance: Instance, api_key: str | None = None,
                 listener: Listener | None = None, lock_fd: int | None = None):
        """`lock_fd`: the fd that holds the instance's lock, watched with its other files (_watch)."""
        self.spec, self.inst, self.policy = spec, instance, spec.policy
        self.program = instance.program
        self.api_key = api_key
        self.listener = listener or (lambda kind, message: None)
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()  # reentrant: signal-safe
        self.log = RotatingLog(instance.log_file, self.policy.log_max_bytes, self.policy.log_keep)
        self.files = KeptFiles(instance, self.log, lock_fd)
        self.probe = Probe(spec.url, api_key)
        self.workers = addresses.parse(addresses.join(spec.rpc)) if getattr(spec, "rpc", None) else []
        self.stall = StallWatch(self.probe, self.workers, self.policy)  # busy slots' progress, and since when
        self.record = self._new_record()
        self.child: subprocess.Popen[bytes] | None = None
        self.launch_no = 0
        self.eof_of = 0  # the last launch whose output has ended
        self.tail: collections.deque[str] = collections.deque(maxlen=300)  # this launch's output
        self.crash_times: collections.deque[float] = collections.deque()  # time.monotonic()
        # BACKOFF: when to launch again, by the monotonic clock; the record's next_start_at is the
        # wall clock's, for `buun status`: a clock set back (NTP, a VM resumed) must not delay it
        self.next_start = 0.0
        self.ever_ready = False
        self.deadline = 0.0  # STARTING: give up when no progress until then
        self.next_probe = 0.0
        self.health_fails = 0
        self.waiting = False  # BACKOFF for a lost worker, said so in the log
        self.failure: BuunError | None = None
        self.next_watch = 0.0

    # --- what a llama-server and a worker do differently (worker.WorkerSupervisor) -------------

    def _new_record(self) -> Record:
        spec = self.spec
        return Record(
            name=spec.name, run_id=spec.run_id, supervisor=ref_of(os.getpid()), recipe=spec.recipe,
            target=spec.target, draft=spec.draft, host=spec.host, port=spec.port,
            command=spec_command(spec), started_at=time.time(), log=str(self.inst.log_file),
        )

    READY_SIGN = "/health not ok"  # what STARTING waits on, for the message when it never comes

    def _ready_probe(self) -> bool:
        return self.probe.health(timeout=1.0).ok

    def _health(self) -> Health:
        return self.probe.health(timeout=self.policy.health_timeout)

    def _diagnose(self, lines: list[str]) -> loglines.Failure | None:
        return loglines.diagnose(lines, self.spec.recipe_flags)

    def _env(self) -> dict[str, str]:
        """llama-server's environment: the rendered launch's (a worker's supervisor has its own)."""
        return self.spec.launch().environ(self.api_key)


    # --- requests (any thread, signal handlers) ---------------------------------------------

    def request_stop(self, why: str = "stop requested") -> None:
        self.events.put(("stop", why))

    def request_restart(self) -> None:
        self.events.put(("restart", None))

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        """Supervise until stopped (returns) or failed (raises the cause)."""
        old = supervise_signals.install(self.request_stop, self.request_restart)
        self.log.event(f"supervisor {os.getpid()} for {self.spec.name}: {shlex.join(self.record.command)}")
        try:
            self._launch()
            while self.record.state not in (State.STOPPED, State.FAILED):
                self._handle_events(TICK)
                self._check()
                if time.monotonic() >= self.next_watch:
                    self.next_watch = time.monotonic() + WATCH_EVERY
                    self._watch()
        finally:
            if self.child is not None and self.child.poll() is None:
                process.stop_group(self.child.pid, self.policy.stop_timeout, self.child)
            supervise_signals.restore(old)
            self.probe.close()
            self.log.close()
            self.files.close()
        if self.failure is not None:
            raise self.failure

    def _handle_events(self, wait: float) -> None:
        try:
            event = self.events.get(timeout=wait)
        except queue.Empty:
            return
        while True:
            self._handle(*event)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, data: Any) -> None:
        if kind == "line":
            launch, line = data
            if launch == self.launch_no:
                self._on_line(line)
        elif kind == "eof":
            self.eof_of = max(self.eof_of, data)
        elif kind == "stop" and self.record.state not in (State.STOPPED, State.FAILED):
            self._stop(data)
        elif kind == "restart" and self.record.state in (State.STARTING, State.READY, State.BACKOFF):
            self._stop("restart requested", final=False)
            self._launch()

    def _check(self) -> None:
        state, now = self.record.state, time.monotonic()
        if state in (State.STARTING, State.READY):
            assert self.child is not None
            code = self.child.poll()
            if code is not None:
                self._exited(code)
            elif state == State.STARTING:
                if now >= self.next_probe:
                    self.next_probe = now + READY_PROBE_EVERY
                    if self._ready_probe():
                        self._ready()
                        return
                if now >= self.deadline:
                    self._hung(f"{self.program} did not become ready: {self.READY_SIGN} and no progress for "
                               f"{self.policy.ready_timeout:g} s (last: {self.record.phase or 'no output'})")
            elif now >= self.next_probe:
                self.next_probe = now + self.policy.health_interval
                if self._worker_closed():
                    return
                began = time.time()
                health = self._health()
                self.health_fails = 0 if health.ok else self.health_fails + 1
                self._unresponsive(None if health.ok else self.record.unresponsive_since or began)
                if self.health_fails >= self.policy.health_failures:
                    self._hung(f"{self.program} stopped answering /health ({health.detail}, "
                               f"{self.health_fails} checks in a row)")
                elif health.ok and (stalled := self.stall.stalled(now)):
                    self._hung(stalled)
        elif state == State.BACKOFF and self.record.next_start_at is not None:
            if now >= self.next_start:
                self._launch()

    # --- transitions ---------------------------------------------------------------------

    def _unresponsive(self, since: float | None) -> None:
        """Tell `buun status` while failed checks pile up (it reads the record, not the loop)."""
        if (since, self.health_fails) != (self.record.unresponsive_since, self.record.health_fails):
            self.record.unresponsive_since, self.record.health_fails = since, self.health_fails
            self._save()

    def _save(self) -> None:
        """Write the record; a failed write (a full disk) is said in the log and written again at
        the next watch, and the loop goes on (KeptFiles.save)."""
        self.files.save(self.record)

    def _tell(self, kind: str, message: str) -> None:
        """The listener (a terminal for `buun serve`) hears of it; a terminal gone (EIO) or a closed
        pipe is no reason to stop supervising."""
        try:
            self.listener(kind, message)
        except OSError:
            pass

    def _watch(self) -> None:
        """Every WATCH_EVERY s: the instance's lock, record and launch spec, made again when deleted
        or damaged while it runs (KeptFiles.watch)."""
        self.files.watch(self.record, self.spec)

    def _set(self, state: State, message: str) -> None:
        old = self.record.state
        if state not in TRANSITIONS[old]:
            raise RuntimeError(f"supervisor bug: {old.value} -> {state.value} is not a valid transition")
        self.record.state = state
        self.record.unresponsive_since, self.record.health_fails = None, 0  # a READY server's alone
        self._save()
        self.log.event(f"{state.value}: {message}")
        self._tell(state.value, message)

    def _launch(self) -> None:
        spec, r = self.spec, self.record
        if self._waiting_for_workers():
            return
        if not process.port_free(spec.host, spec.port):
            holder = process.port_holder(spec.port)
            who = holder.describe() if holder else "another program"
            self._launch_failed(loglines.Failure(
                "bind", f"port {spec.port} on {spec.host} is in use by {who}",
                "pass --port N for a free port, or stop that program", True, Exit.CONFLICT))
            return
        self.launch_no += 1
        if self.launch_no > 1:
            r.restarts += 1
        self.tail.clear()
        try:
            self.child = process.spawn(spec.argv, self._env(), stdout=subprocess.PIPE)
        except OSError as exc:
            self._launch_failed(loglines.Failure("exec", f"cannot run {spec.binary}: {exc}", "run `buun build`",
                                                 True, Exit.NOT_READY))
            return
        assert self.child.stdout is not None
        threading.Thread(target=self._read, args=(self.child.stdout, self.launch_no), daemon=True,
                         name=f"{self.program}-output-{self.launch_no}").start()
        r.server = ref_of(self.child.pid)
        r.server_started_at, r.ready_at, r.next_start_at, r.phase = time.time(), None, None, "launching"
        self.deadline = time.monotonic() + self.policy.ready_timeout
        self.next_probe = time.monotonic() + READY_PROBE_EVERY
        self._set(State.STARTING, f"launched {self.program} (pid {self.child.pid}) on {spec.url}")

    def _read(self, stream: IO[bytes], launch: int) -> None:
        """Output thread: every line to the log, and to the loop as an event."""
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.write(line)
            self.events.put(("line", (launch, line)))
        stream.close()
        self.events.put(("eof", launch))

    def _on_line(self, line: str) -> None:
        self.tail.append(line)
        if self.record.state == State.STARTING:
            self.deadline = time.monotonic() + self.policy.ready_timeout  # progress extends the wait
            phase = loglines.phase_of(line, self.record.phase)
            if phase:
                self.record.phase = phase
                self._save()
                self._tell("phase", phase)

    def _drain_output(self) -> None:
        """After the child exited: take its last lines (up to its EOF) before judging."""
        deadline = time.monotonic() + EOF_WAIT
        while self.eof_of < self.launch_no and time.monotonic() < deadline:
            try:
                kind, data = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                return
            if kind == "eof":
                self.eof_of = max(self.eof_of, data)
            elif kind == "line":
                if data[0] == self.launch_no:
                    self.tail.append(data[1])
            else:
                self.events.put((kind, data))  # a stop/restart request: keep it for the loop
                return

    def _ready(self) -> None:
        self.ever_ready = True
        self.health_fails = 0
        self.record.ready_at, self.record.phase = time.time(), ""
        self.next_probe = time.monotonic() + self.policy.health_interval
        self.record.lost_workers, self.record.lost_since = {}, None
        self.stall.reset()
        self._set(State.READY, f"{self.program} is ready on {self.spec.url}")

    def _exited(self, code: int) -> None:
        self._drain_output()
        lines = list(self.tail)
        failure = self._diagnose(lines)
        reason = f"{self.program} {process.exit_reason(code)}"
        if self.record.state == State.STARTING and not self.ever_ready:
            self._launch_failed(failure or loglines.exited_while_starting(reason))
            return
        known = loglines.notable(lines)
        cause = failure.message.splitlines()[0] if failure else (
            f"{reason} ({loglines.clean(known[-1])})" if known else reason)
        # ggml-rpc's abort guesses at the worker's side ("answers, but not as ggml-rpc-server
        # does"): a worker found gone after it is the cause seen, with the exit alone beside it
        self._crashed(cause, lines, reason if failure and failure.kind == "rpc" else None)

    def _hung(self, cause: str) -> None:
        assert self.child is not None
        process.kill_group(self.child.pid, self.child)
        self._drain_output()
        if not self.ever_ready:
            self._launch_failed(loglines.Failure("timeout", cause, "see the log (`buun logs`); a large model on a "
                                                 "slow disk may need --ready-timeout", True))
        else:
            self._crashed(cause, list(self.tail))

    def _launch_failed(self, failure: loglines.Failure) -> None:
        """A launch that never got ready: final before the first ready, a crash after it."""
        if self.ever_ready:
            self._crashed(failure.message, list(self.tail))
            return
        self._fail(loglines.launch_error(failure, list(self.tail), f"see `{self.inst.command('logs')}`"))

    def _crashed(self, cause: str, lines: list[str], if_lost: str | None = None) -> None:
        """`if_lost`: what to say beside the lost workers instead of `cause`, when `cause` is only
        a guess at what a worker did."""
        lost = rpc.unreachable(self.workers, min(self.policy.health_timeout, rpc.PROBE_TIMEOUT))
        if lost:  # the server is gone, so a probe is safe (rpc.py): was a worker the cause?
            cause = f"{note_lost(self.record, lost)}; {if_lost or cause}"
        else:
            self.record.lost_workers, self.record.lost_since = {}, None
        step = f" ({steps(lost)})" if lost else ""
        now = time.monotonic()
        self.crash_times.append(now)
        while self.crash_times and self.crash_times[0] < now - self.policy.crash_window:
            self.crash_times.popleft()
        r = self.record
        r.crashes += 1
        r.last_crash = cause
        r.server = None
        if len(self.crash_times) >= self.policy.max_crashes:
            self._fail(BuunError(
                f"{self.program} crashed {len(self.crash_times)} times within {self.policy.crash_window:g} s; "
                f"buun stopped restarting it. Last crash: {cause}{step}\n{loglines.summary(lines)}",
                f"`{self.inst.command('logs')}` has the full output; fix the cause, then "
                f"`{self.inst.start_command}` again"))
            return
        delay = self.policy.backoff(len(self.crash_times))
        self.next_start, r.next_start_at = now + delay, time.time() + delay
        self.waiting = False
        self._set(State.BACKOFF, f"{cause}; restarting in {delay:.1f} s{step}")

    def _fail(self, error: BuunError) -> None:
        if self.child is not None and self.child.poll() is None:
            process.stop_group(self.child.pid, min(self.policy.stop_timeout, 5.0), self.child)
        self.record.error = {"message": error.message, "hint": error.hint, "exit_code": int(error.exit_code)}
        self.record.server, self.record.next_start_at, self.record.phase = None, None, ""
        self.failure = error
        self._set(State.FAILED, error.message)

    def _stop(self, why: str, final: bool = True) -> None:
        self._set(State.STOPPING, why)
        if self.child is not None:
            how = process.stop_group(self.child.pid, self.policy.stop_timeout, self.child)
            self.log.event(f"{self.program} (pid {self.child.pid}) {how}")
            self._drain_output()
        self.record.server, self.record.next_start_at = None, None
        if final:
            self._set(State.STOPPED, "stopped")

    # --- RPC workers ---------------------------------------------------------------------

    def _waiting_for_workers(self) -> bool:
        """Before a launch: do all workers answer? A worker that does not is final before the first
        ready; after it, the server waits in BACKOFF (no crash counted) until the worker is back."""
        lost = rpc.unreachable(self.workers, min(self.policy.health_timeout, rpc.PROBE_TIMEOUT))
        if not lost:
            return False
        if not self.ever_ready:
            self._fail(BuunError("; ".join(f"worker {w} is not reachable ({why})" for w, why in lost.items()),
                                 steps(lost), Exit.NOT_READY))
            return True
        changed = set(lost) != set(self.record.lost_workers) or not self.waiting
        text = note_lost(self.record, lost)
        self.next_start, self.record.next_start_at = time.monotonic() + WORKER_RETRY, time.time() + WORKER_RETRY
        if changed or self.record.state != State.BACKOFF:  # said once, not at each probe
            self.waiting = True
            self._set(State.BACKOFF, f"{text}: {steps(lost)}; {self.program} starts again once it answers")
        else:
            self._save()
        return True

    def _worker_closed(self) -> bool:
        """READY: has a worker closed its end of llama-server's connection (it died, or its SSH
        tunnel did)? Then llama-server fails at its next request: relaunch it now, which waits
        for the worker. Its connections are read, not probed (rpc.py)."""
        if not self.workers or self.child is None:
            return False
        closed = rpc.lost_in(rpc.connections(self.child.pid, self.workers))
        if not closed:
            return False
        process.kill_group(self.child.pid, self.child)
        self._drain_output()
        self._crashed(f"{', '.join(closed)} closed its connection to {self.program}", list(self.tail))
        return True


def spec_command(spec: LaunchSpec) -> list[str]:
    from buun_tool.base.command import mask

    return mask(spec.argv)

