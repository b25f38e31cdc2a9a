"""Where a supervisor tells its state changes: a listener, called with (kind, message), kind a
state's value or "phase". `buun serve`'s is its terminal; these are the detached supervisor's and
the systemd unit's (supervisor.py, worker.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from buun_tool.server.instance import Instance
from buun_tool.server.logfile import RotatingLog
from buun_tool.server.spec import Policy

Listener = Callable[[str, str], None]  # (kind, message): kind is a state value or "phase"


def report(kind: str, message: str) -> None:
    """A supervisor's listener before it has its own output (detached_output)."""
    print(f"{time.strftime('%H:%M:%S')} {kind}: {message}", flush=True)


def detached_output(inst: Instance, policy: Policy) -> Listener:
    """A detached supervisor's listener: its state changes to supervisor.log, rotated as the
    instance's log is (one that restarted a crashing server for months grew it without end). Its
    stdout and stderr follow the file, for what Python itself writes there (a traceback)."""
    out = RotatingLog(inst.supervisor_log, policy.log_max_bytes, policy.log_keep, follow=(1, 2))
    return lambda kind, message: out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {kind}: {message}")
