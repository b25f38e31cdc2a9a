"""Two lanes of `buun setup` at once: the downloads (pull, drafter) beside vendor -> patch -> build.

The downloads (~17 GB, half an hour on a home line) and the build (10-20 minutes) need nothing of
each other, so setup runs them together and a user waits for the longer one, not for the sum.

- The build's lane runs in this process's main thread, as every stage did before: Python raises a
  Ctrl-C (KeyboardInterrupt) and a SIGTERM (errors.Terminated) there, and the build's programs
  start from there (proc.dies_with_us ties their life to that thread).
- The downloads run in a process of their own, forked when the lanes start (the process has no
  other thread then), not in a thread: the build's lane starts its programs with a preexec_fn,
  which runs the interpreter's at-fork hooks in the child before the exec, and huggingface_hub's
  (close_session) takes its connection pool's lock there: held at that moment by a download
  thread, it is never released in the child, and the build waited for a `git` that never started.
  A process is also stopped at once, wherever it waits (a Hub that sends nothing): SIGTERM, which
  unwinds it as it unwinds any command (partial files stay, to resume; records are written whole),
  then SIGKILL after STOP_WAIT_S.
- The child prints nothing itself: its console lines and the progress of its transfers come back
  over a pipe, and a thread here prints them (Downloads), so that the two lanes' lines never cut
  into each other or into the build's progress bar.
- When the downloads fail while the build runs, the build is stopped the way a Ctrl-C stops it: the
  reading thread sends the main thread a signal, whose handler raises _Halt there. A read or wait
  the build blocks in is cut short, and every stage's own cleanup for an interruption runs (the
  build's programs are stopped: proc.run_logged; a `git am` is left for the next run to end).
  SIGURG, whose default action is to ignore it: one that came late would do nothing.
- The error raised is the one that happened first, so the exit code is the one the failing stage
  has on its own (a BuunError's, or an OSError's as the CLI maps it); when the other lane failed
  too, on its own, that error is printed before it. A Ctrl-C or SIGTERM stops both and is raised as
  it is (exit 130, 143).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

from rich.console import Console

from buun_tool.app.downloads import Downloads
from buun_tool.base import console, proc
from buun_tool.base.errors import DISK_FULL, BuunError, Exit, Terminated, disk_full, raise_terminated

STOP_WAIT_S = 5.0  # how long a stopped download may take to unwind before it is killed
_SIGNAL = signal.SIGURG

Step = tuple[str, Callable[[], Any]]  # a stage's name, and the call that runs it (or skips it): its result


class _Halt(BaseException):
    """Raised in the main thread when the downloads failed: the build's lane stops as on a Ctrl-C."""


@dataclass
class _Failure:
    stage: str
    error: BaseException
    at: float = field(default_factory=time.monotonic)


def _halted(exc: BaseException | None) -> bool:
    """Whether `exc` is the halt (or what a stage made of it), not a failure of the build's lane."""
    for _ in range(20):
        if exc is None:
            return False
        if isinstance(exc, _Halt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# --- the child: the downloads' lane ---------------------------------------------------------

class _Lines:
    """sys.stdout and sys.stderr in the child (a library's warning, a logging line): each line sent."""

    def __init__(self, conn: Connection):
        self.conn, self.held = conn, ""

    def write(self, text: str) -> int:
        self.held += text
        *lines, self.held = self.held.split("\n")
        for line in lines:
            self.conn.send(("say", "info", line))
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


def _relay(conn: Connection, downloads: Downloads) -> None:
    """The child's output, all of it, sent to the parent: console lines by kind (printed there as
    they would be here), other text by line, the transfers' progress as events."""
    for kind in ("info", "step", "ok", "warn"):
        setattr(console, kind, lambda message, kind=kind: conn.send(("say", kind, message)))
    sys.stdout = sys.stderr = _Lines(conn)  # type: ignore[assignment]
    console.err = console.out = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    downloads.relay_to(conn)


def _portable(exc: BaseException) -> BaseException:
    """`exc` as it can cross the pipe and mean the same there (BuunError's pickle drops its hint and
    exit code; OSError's keeps errno and file name, which the CLI maps)."""
    if isinstance(exc, BuunError):
        return _Carried(exc.message, exc.hint, int(exc.exit_code))
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError("".join(traceback.format_exception(exc)).rstrip())


class _Carried(Exception):
    def __init__(self, message: str, hint: str | None, exit_code: int):
        super().__init__(message, hint, exit_code)

    def error(self) -> BuunError:
        message, hint, exit_code = self.args
        return BuunError(message, hint, Exit(exit_code))


def _child(steps: list[Step], downloads: Downloads, conn: Connection) -> None:
    """The forked process: the steps, their results and its end sent over `conn`; never returns."""
    code = 1
    try:
        signal.signal(_SIGNAL, signal.SIG_DFL)
        for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind, as the CLI does (the parent stops it so)
            signal.signal(sig, raise_terminated)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _relay(conn, downloads)
        stage = ""
        try:
            for stage, step in steps:
                conn.send(("result", stage, _result(step())))
            conn.send(("done",))
        except (KeyboardInterrupt, Terminated) as exc:
            conn.send(("stopped", exc.signum if isinstance(exc, Terminated) else signal.SIGINT))
        except BaseException as exc:
            conn.send(("failed", stage, _portable(exc)))
        code = 0
    finally:
        os._exit(code)


def _result(value: Any) -> Any:
    try:
        pickle.dumps(value)
        return value
    except Exception:
        return None


# --- here: the build's lane, and the child's output --------------------------------------------

class _Lanes:
    """One run of the two lanes: the downloads' process, the thread that prints what it says, and
    the main thread's halt."""

    def __init__(self, downloads: Downloads):
        self.downloads = downloads
        self.main = threading.get_ident()
        self.armed = False  # the build's lane runs: a failure of the downloads halts it
        self.halt_sent = False
        self.failure: _Failure | None = None  # the downloads'
        self.results: dict[str, Any] = {}
        self.ended_well = False
        self.stopping = False
        self.pid = 0  # the downloads' process, until it is reaped
        self.reader: threading.Thread | None = None

    def start(self, steps: list[Step]) -> None:
        if not steps:
            self.ended_well = True
            return
        read, write = Pipe(duplex=False)
        arm = proc.dies_with_us()  # the child is killed if this process dies without stopping it
        pid = os.fork()
        if pid == 0:
            read.close()
            arm()
            _child(steps, self.downloads, write)
        write.close()
        self.pid = pid
        self.reader = threading.Thread(target=self._read, args=(read,), name="buun-setup-downloads", daemon=True)
        self.reader.start()

    def _read(self, conn: Connection) -> None:
        try:
            while True:
                message = conn.recv()
                try:
                    self._said(message)
                except Exception as exc:  # said, and the reading goes on: a full pipe would block the child
                    if self.failure is None:
                        self._failed("", exc)
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
        if not self.ended_well and self.failure is None and not self.stopping:
            self._failed("", BuunError("the download process ended without a word (killed?)",
                                       "run the same command again: the downloads resume where they stopped"))

    def _said(self, message: tuple[Any, ...]) -> None:
        kind, *rest = message
        if kind == "say":
            getattr(console, rest[0])(rest[1])
        elif kind == "progress":
            self.downloads.mirror(*rest)
        elif kind == "result":
            self.results[rest[0]] = rest[1]
        elif kind == "done":
            self.ended_well = True
        elif kind == "stopped" and not self.stopping:  # not by this process: a Ctrl-C, a `kill`
            self._failed("", KeyboardInterrupt() if rest[0] == signal.SIGINT else Terminated(rest[0]))
        elif kind == "failed":
            error = rest[1].error() if isinstance(rest[1], _Carried) else rest[1]
            self._failed(rest[0], error)

    def _failed(self, stage: str, error: BaseException) -> None:
        self.failure = _Failure(stage, error)
        if self.armed:  # the build's lane still runs: halt it (once it ended, _run finds the failure)
            self.halt_sent = True
            signal.pthread_kill(self.main, _SIGNAL)

    def on_signal(self, signum: int, frame: object) -> None:
        """The handler, in the main thread: one halt at most, and only while the build's lane runs."""
        if self.armed and self.halt_sent:
            self.armed = False
            raise _Halt

    def foreground(self, steps: list[Step]) -> _Failure | None:
        """The build's lane; its own failure (a Ctrl-C included), None when it ended or was halted."""
        try:
            return self._foreground(steps)
        except _Halt:  # landed after the lane ended, before it was disarmed: the downloads failed
            return None

    def _foreground(self, steps: list[Step]) -> _Failure | None:
        stage = ""
        try:
            self.armed = True
            for name, step in steps:
                stage = name
                self.results[name] = step()
            self.armed = False
        except BaseException as exc:
            self.armed = False
            return None if _halted(exc) else _Failure(stage, exc)
        return None

    def wait(self, stop: bool) -> None:
        """Until the downloads' process has ended, and is reaped: stopped at once when `stop`, else
        when its work is done. A Ctrl-C meanwhile is raised here at once; it is stopped all the same."""
        if self.reader is None:  # no downloads to run
            return
        try:
            while not stop and self.reader.is_alive():
                self.reader.join(0.2)
        finally:
            self._reap()
            self.reader.join()  # it has read all: the child's end of the pipe closed with it

    def _reap(self) -> None:
        """The process reaped: if it still runs, stopped with SIGTERM, and SIGKILL STOP_WAIT_S later."""
        if not self.pid:
            return
        if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            self.stopping = True
            os.kill(self.pid, signal.SIGTERM)  # not reaped yet: the PID is still this child's
            deadline = time.monotonic() + STOP_WAIT_S
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.02)
        self.pid = 0


def side_by_side(foreground: list[Step], background: list[Step], downloads: Downloads) -> dict[str, Any]:
    """Run the `background` steps in a process of their own while the `foreground` ones run here;
    return what each step returned, by name, once both lanes are done, or raise the first failure
    of either once the other is stopped."""
    if threading.current_thread() is not threading.main_thread():  # no signal reaches this thread:
        return {name: step() for name, step in [*foreground, *background]}  # one after the other
    lanes = _Lanes(downloads)
    previous = signal.signal(_SIGNAL, lanes.on_signal)
    try:
        return _run(lanes, foreground, background)
    finally:
        downloads.hide()
        signal.signal(_SIGNAL, previous)


def _run(lanes: _Lanes, foreground: list[Step], background: list[Step]) -> dict[str, Any]:
    lanes.start(background)
    own = lanes.foreground(foreground)
    try:
        if own is None and lanes.failure is None:
            lanes.downloads.show_live()
        lanes.wait(stop=own is not None)
    except BaseException as exc:  # a Ctrl-C or SIGTERM while the downloads go on alone
        own = _Failure("", exc)
    failures = sorted((f for f in (own, lanes.failure) if f is not None), key=lambda f: f.at)
    if not failures:
        return lanes.results
    stops = [f for f in failures if not isinstance(f.error, Exception)]  # a Ctrl-C, a SIGTERM: they win
    first = (stops or failures)[0]
    for other in failures:
        if other is not first and isinstance(other.error, Exception):
            _say(other)
    raise first.error


def _say(failure: _Failure) -> None:
    """The other lane's failure, printed as the CLI prints the one raised after it: both are said."""
    exc = failure.error
    if isinstance(exc, BuunError):
        error = exc
    elif isinstance(exc, OSError) and exc.errno in DISK_FULL:
        error = disk_full(exc)
    else:
        error = BuunError(f"{type(exc).__name__}: {exc}")
    console.err.print(console.labelled("error:", "bold red", f"{failure.stage}: {error.message}"))
    if error.hint:
        console.err.print(console.labelled("hint:", "bold", error.hint))
