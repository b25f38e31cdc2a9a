"""Whether a live supervisor's record lags behind what the supervisor does, for `buun status`.

On a full disk the supervisor cannot write its record, so the file keeps an older state than the
one it runs: status says so, and which server or worker runs now (supervise_files writes the
signs this reads).
"""

from __future__ import annotations

import time

import psutil

from buun_tool.server.instance import Instance, live
from buun_tool.server.state import Record

# How far a live supervisor's record may lag behind what it does before `buun status` calls it
# stale: a record is written within milliseconds of its updated_at, and a launch as it starts.
RECORD_LAG_S = 2.0


def lag(inst: Instance, r: Record, running: bool) -> tuple[str | None, psutil.Process | None]:
    """Why the record of a live supervisor is older than what the supervisor does, or None; and the
    server (or worker) it runs now when the record names another. Two signs, both seen on a full
    disk: each write the supervisor could not make set the old record's modification time, which
    needs no free space (supervisor._save), so the file changed well after the record's updated_at;
    or the supervisor runs a process launched after the record was written, which it does not name."""
    if not running:
        return None, None
    why = []
    try:
        tried = inst.state_file.stat().st_mtime
    except OSError:
        tried = r.updated_at
    if tried - r.updated_at > RECORD_LAG_S:
        why.append(f"its supervisor could not write it since {_clock(r.updated_at)} (a full disk, or a file-size "
                   f"limit; last tried at {_clock(tried)})")
    current = _unrecorded(inst, r)
    if current is not None:
        named = f", not pid {r.server.pid}" if r.server else ""
        why.append(f"{inst.program} now runs as pid {current.pid} (launched at {_clock(current.create_time())}"
                   f"{named}), which the record does not name")
    if not why:
        return None, None
    return f"written at {_clock(r.updated_at)}; " + "; ".join(why), current


def _unrecorded(inst: Instance, r: Record) -> psutil.Process | None:
    """The program the record's supervisor runs, when it is not the one the record names and started
    no earlier (psutil's start times tick in 10 ms: a relaunch can share its predecessor's), or the
    record names none, and long enough ago that the supervisor would have recorded it. Both tests
    stay on psutil's clock: its start times count from a boot time in whole seconds, a second or
    more off time.time() on some machines, so a relaunch within a second of the record's updated_at
    could look older than the record."""
    sup = live(r.supervisor)
    if sup is None:
        return None
    try:
        for child in sup.children():
            if (child.status() != psutil.STATUS_ZOMBIE and inst.program in " ".join(child.cmdline())
                    and (r.server is None or (r.server.pid != child.pid
                                              and child.create_time() >= r.server.create_time))
                    and _age(child) > RECORD_LAG_S):
                return child
    except psutil.Error:
        pass
    return None


def _age(proc: psutil.Process) -> float:
    """Seconds since `proc` started: its start since boot (psutil's start time less its boot time)
    against the time since boot, one clock for both."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) - (proc.create_time() - psutil.boot_time())


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
