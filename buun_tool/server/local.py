"""One llama-server for one job (a benchmark configuration, a memory measurement, a test): launched
on loopback, ready when /health says so, its failure diagnosed, stopped with its whole group.

    launch = settings.render(binary, target, draft, "127.0.0.1", process.free_port())  # ServerSettings
    with LocalServer(launch.argv, log_path, env=launch.env) as server:
        requests.post(server.url + "/completion", ...)

Unlike the supervisor (supervisor.py), which keeps a server running and relaunches it, a local
server that fails is an error at once. Both launch, diagnose a failed start and stop the same way:
process.spawn (own session, dies with its launcher), loglines.diagnose / launch_error (the same
message for the same output), process.stop_group (SIGTERM, grace, SIGKILL of the group, reap).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from buun_tool.base import command
from buun_tool.base.errors import BuunError, Exit, raise_terminated
from buun_tool.server import loglines, process
from buun_tool.server.health import Probe

READY_PROBE_EVERY = 0.25  # seconds between /health probes while loading


def _address(argv: Sequence[str]) -> tuple[str, int]:
    """The --host and --port of a llama-server argv (ServerSettings.render always sets both)."""
    def value(flag: str) -> str:
        if flag not in argv:
            raise ValueError(f"the llama-server command has no {flag}: build it with ServerSettings.render")
        return argv[argv.index(flag) + 1]

    return value("--host"), int(value("--port"))


class LocalServer:
    """`with LocalServer(argv, log_path) as s: s.url`: start waits until /health answers ok
    (at most `load_timeout` s) while checking that the process lives; stop (also on any error,
    and on a SIGTERM of this process while it runs) stops the whole process group.

    The server writes straight into `log_path` (no reader in between to slow a verbose server),
    which is read back only to judge a failure. `env` is added to this process's environment.
    `recipe_flags` (flag names the recipe set) make a rejected flag's error say where it came
    from, as `buun serve`'s does. Launch it from the main thread: the server's death signal
    follows the thread that forked it (process.spawn)."""

    def __init__(self, argv: Sequence[str], log_path: Path, load_timeout: float = 300.0, grace: float = 10.0,
                 env: Mapping[str, str] | None = None, recipe_flags: Sequence[str] = ()):
        self.argv, self.log_path = list(argv), log_path
        self.host, self.port = _address(self.argv)
        self.load_timeout, self.grace = load_timeout, grace
        self.env = {**os.environ, **(env or {})}
        self.recipe_flags = list(recipe_flags)
        self.proc: subprocess.Popen[bytes] | None = None
        self._old_sigterm: Any = None
        self._stopped = False

    @property
    def url(self) -> str:
        return command.base_url(self.host, self.port)

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if threading.current_thread() is threading.main_thread():
            # a `kill` unwinds through stop() instead of leaving the server behind: `buun` itself
            # has this handler already (__main__), a test or a script using LocalServer may not
            self._old_sigterm = signal.signal(signal.SIGTERM, raise_terminated)
        try:
            with open(self.log_path, "wb") as log:
                log.write(("$ " + shlex.join(self.argv) + "\n").encode())
                log.flush()
                try:
                    self.proc = process.spawn(self.argv, self.env, stdout=log)
                except OSError as exc:
                    raise BuunError(f"cannot run {self.argv[0]}: {exc}", "run `buun build`", Exit.NOT_READY) from exc
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def lines(self) -> list[str]:
        """The server's output so far (the command line first)."""
        return self.log_path.read_text(errors="replace").splitlines()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.load_timeout
        probe = Probe(self.url)
        try:
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    lines = self.lines()[1:]
                    failure = loglines.diagnose(lines, self.recipe_flags) or loglines.exited_while_starting(
                        f"llama-server {process.exit_reason(code)}")
                    raise loglines.launch_error(failure, lines, f"the whole output: {self.log_path}")
                if probe.health(timeout=2.0).ok:
                    return
                time.sleep(READY_PROBE_EVERY)
        finally:
            probe.close()
        phase = loglines.last_phase(self.lines())
        raise BuunError(f"llama-server was not ready after {self.load_timeout:g} s (last: {phase or 'no output'})",
                        f"see {self.log_path}; a large model on a slow disk may need a larger --load-timeout")

    def stop(self) -> None:
        """The stop flow (process.stop_group); safe to call twice."""
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        if self.proc is not None and not self._stopped:
            self._stopped = True
            # also after the server exited: what it spawned may live on in its group
            process.stop_group(self.proc.pid, self.grace, self.proc)
