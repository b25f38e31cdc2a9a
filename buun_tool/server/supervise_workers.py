"""What the supervisor tells of its RPC workers (`--rpc`): the lost ones in its record and
messages, the next step for each, and a request that makes no progress while /health answers
(a worker that stopped answering without closing its connection). The transitions they lead to
are the loop's (supervise.py)."""

from __future__ import annotations

import json
import time
from typing import Any

from buun_tool.server import addresses
from buun_tool.server.addresses import Endpoint
from buun_tool.server.health import Probe
from buun_tool.server.spec import Policy
from buun_tool.server.state import Record


def note_lost(record: Record, lost: dict[str, str]) -> str:
    """Record the workers that do not answer; the text that says so."""
    if set(lost) != set(record.lost_workers):
        record.lost_since = time.time()
    record.lost_workers = lost
    return "; ".join(f"worker {w} lost ({why})" for w, why in lost.items())


def steps(lost: dict[str, str]) -> str:
    return "; ".join(addresses.next_step(w) for w in lost)


class StallWatch:
    """The busy slots' progress, and since when it is unchanged."""

    def __init__(self, probe: Probe, workers: list[Endpoint], policy: Policy):
        self.probe, self.workers, self.policy = probe, workers, policy
        self.progress: tuple[list[Any], float] | None = None

    def reset(self) -> None:
        self.progress = None

    def stalled(self, now: float) -> str | None:
        """With workers: the cause when a request has made no progress for the policy's
        stall_timeout while /health answers. llama-server waits on a worker's reply without a
        timeout, and answers /health (and /slots) meanwhile, so a worker that stops answering
        without closing the connection (frozen, or its network gone) hangs the request for good."""
        if not self.workers or not self.policy.stall_timeout:
            return None
        code, body = self.probe.get_json("/slots")
        if code != 200 or not isinstance(body, list):
            return None  # /slots off (--no-slots): no way to tell
        busy = [json.dumps([s.get("id"), s.get("id_task"), s.get("n_prompt_tokens_processed"), s.get("next_token")])
                for s in body if isinstance(s, dict) and s.get("is_processing")]
        if not busy:
            self.progress = None
        elif self.progress is None or self.progress[0] != busy:
            self.progress = (busy, now)
        elif now - self.progress[1] >= self.policy.stall_timeout:
            return (f"a request made no progress for {now - self.progress[1]:.0f} s while /health answered: a worker "
                    f"stopped answering without closing its connection (frozen, or its network gone); "
                    f"`buun worker status` on each of {addresses.join(self.workers)} shows it")
        return None
