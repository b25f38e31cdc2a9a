"""`buun status` on a record its supervisor could not keep up to date (server/record_lag.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

from buun_tool.server import record_lag
from buun_tool.server.state import ProcRef, Record


def _ref(proc: psutil.Process) -> ProcRef:
    return ProcRef(proc.pid, proc.create_time())


def test_a_relaunch_is_told_from_the_record_on_psutils_clock(tmp_path: Path) -> None:
    """A record's stamps are time.time(), psutil's start times count from a boot time in whole
    seconds: on one machine they ran 1-1.5 s behind, so a server relaunched within a second before
    the record's updated_at looked older than the record and status missed that the record names a
    server that is gone. Here the record is stamped 1.5 s after the relaunch's psutil start time,
    as that machine's clocks made it look; this process stands for the supervisor."""
    old = subprocess.Popen(["sleep", "60"])
    recorded = _ref(psutil.Process(old.pid))
    old.kill()
    old.wait()
    new = subprocess.Popen(["sleep", "60"])
    try:
        started = psutil.Process(new.pid).create_time()
        state = tmp_path / "state.json"
        state.write_text("{}")
        inst = SimpleNamespace(program="sleep", state_file=state)
        r = Record("x", "run", supervisor=_ref(psutil.Process()), server=recorded, updated_at=started + 1.5)
        # younger than RECORD_LAG_S: the supervisor may not have written its record yet
        assert record_lag.lag(inst, r, running=True) == (None, None)  # type: ignore[arg-type]
        time.sleep(record_lag.RECORD_LAG_S + 0.2)
        behind, current = record_lag.lag(inst, r, running=True)  # type: ignore[arg-type]
        assert current is not None and current.pid == new.pid, behind
        assert f"sleep now runs as pid {new.pid}" in (behind or "") and f"not pid {recorded.pid}" in (behind or "")
    finally:
        new.kill()
        new.wait()
