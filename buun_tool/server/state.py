"""The states of a supervised server and the record written for each instance.

Only the supervisor's loop changes the state (see supervisor.py); everyone else reads the
record. The record is plain JSON so `buun status --json` and scripts can use it as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class State(StrEnum):
    STOPPED = "stopped"  # no supervisor, no server
    STARTING = "starting"  # llama-server launched, loading, /health not ok yet
    READY = "ready"  # /health answers ok
    STOPPING = "stopping"  # SIGTERM sent, waiting for the group to exit
    BACKOFF = "backoff"  # crashed; waiting before the next launch
    FAILED = "failed"  # gave up: a cause restarting cannot fix, or too many crashes

    @property
    def running(self) -> bool:
        """A supervisor is (or should be) in charge."""
        return self in (State.STARTING, State.READY, State.STOPPING, State.BACKOFF)


# Which changes the loop may make; anything else is a bug in the loop, caught at once.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING, State.FAILED}),
    State.STARTING: frozenset({State.READY, State.BACKOFF, State.STOPPING, State.FAILED}),
    State.READY: frozenset({State.BACKOFF, State.STOPPING, State.FAILED}),
    State.BACKOFF: frozenset({State.STARTING, State.BACKOFF, State.STOPPING, State.FAILED}),  # a relaunch can fail
    State.STOPPING: frozenset({State.STOPPED, State.STARTING, State.BACKOFF, State.FAILED}),  # restart = stop + launch
    State.FAILED: frozenset(),
}


@dataclass
class ProcRef:
    """A process as (pid, create_time): a PID reused by another program does not match."""

    pid: int
    create_time: float


@dataclass
class Record:
    name: str
    run_id: str
    state: State = State.STOPPED
    phase: str = ""  # what llama-server is doing while STARTING ("loading tensors", ...)
    supervisor: ProcRef | None = None
    server: ProcRef | None = None
    recipe: str = ""
    target: str = ""
    draft: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    command: list[str] = field(default_factory=list)  # masked argv
    started_at: float | None = None  # supervisor start
    server_started_at: float | None = None  # current llama-server launch
    ready_at: float | None = None
    restarts: int = 0  # launches after the first one (crashes, hangs, `buun restart`)
    crashes: int = 0
    last_crash: str = ""
    next_start_at: float | None = None  # during BACKOFF
    unresponsive_since: float | None = None  # READY: when the first of the failed /health checks in a row began
    health_fails: int = 0  # those failed checks; the supervisor relaunches at the policy's health_failures
    lost_workers: dict[str, str] = field(default_factory=dict)  # RPC workers that do not answer: {address: why}
    lost_since: float | None = None  # since when that set of workers is lost
    error: dict[str, Any] | None = None  # FAILED: {"message", "hint", "exit_code"}
    log: str = ""
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["state"] = State(known.get("state", "stopped"))
        for key in ("supervisor", "server"):
            if known.get(key):
                known[key] = ProcRef(**known[key])
        return cls(**known)
