"""llama-server's /metrics (Prometheus text) and the DFlash figures drawn from it.

Names checked against tools/server/server-task.cpp of the pinned llama.cpp
(server_task_result_metrics::to_metrics): counters `llamacpp:spec_decode_num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_drafts_total` (verification steps) and the labelled
`..._num_accepted_tokens_per_pos_total{position="i"}`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from buun_tool.base.command import is_count

PREFIX = "llamacpp:"
DRAFT_TOKENS = PREFIX + "spec_decode_num_draft_tokens_total"
ACCEPTED = PREFIX + "spec_decode_num_accepted_tokens_total"
DRAFTS = PREFIX + "spec_decode_num_drafts_total"
PER_POS = PREFIX + "spec_decode_num_accepted_tokens_per_pos_total"
PREDICTED = PREFIX + "tokens_predicted_total"
PREDICTED_SECONDS = PREFIX + "tokens_predicted_seconds_total"

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Samples by metric name, then by their (sorted) labels. Comments and bad lines are skipped."""
    out: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        out.setdefault(m.group(1), {})[labels] = value
    return out


# Draft positions llama-server counts: a block of 16, a tree's depth. A label past this is not one
# (a position of 10^11 made a list that long: the memory, or hours).
MAX_POSITIONS = 256


def _scalar(samples: dict[str, dict[Labels, float]], name: str) -> float | None:
    series = samples.get(name)
    return series.get((), None) if series else None


# A figure a server reports (a /metrics sample, a field of /slots) is a number of 0 or more, or it
# is none: NaN, infinite, negative, or not a number at all (a string, a bool, a list for /slots'
# `timings`, from a server that is not llama-server). Such a server counts nothing these figures
# can use; int() of NaN or inf, or arithmetic on a string, was a traceback in `buun status`.
def figure(value: Any) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) and number >= 0 else None


def count(value: Any) -> int | None:
    """A figure that counts (tokens, drafts, a task's id), whole."""
    number = figure(value)
    return int(number) if number is not None else None


@dataclass
class DFlashStats:
    drafts: int  # verification steps that carried a draft
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens the target accepted
    acceptance_rate: float | None  # accepted / drafted
    mean_accepted: float | None  # accepted draft tokens per step
    mean_acceptance_length: float | None  # tokens committed per step: accepted + the target's bonus token
    accepted_per_position: list[int] = field(default_factory=list)
    tokens_per_second: float | None = None  # average generation speed since start

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dflash_stats(samples: dict[str, dict[Labels, float]]) -> DFlashStats | None:
    """The speculative-decoding figures; None when the server exports none (not a DFlash build)."""
    drafted, accepted, drafts = (count(_scalar(samples, n)) for n in (DRAFT_TOKENS, ACCEPTED, DRAFTS))
    if drafted is None and accepted is None and drafts is None:
        return None
    drafted_i, accepted_i, drafts_i = drafted or 0, accepted or 0, drafts or 0
    per_pos: dict[int, int] = {}
    for labels, value in (samples.get(PER_POS) or {}).items():
        pos, n = dict(labels).get("position"), count(value)
        if pos is not None and is_count(pos) and int(pos) < MAX_POSITIONS and n is not None:
            per_pos[int(pos)] = n
    per_pos_list = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)] if per_pos else []
    tokens, seconds = count(_scalar(samples, PREDICTED)), figure(_scalar(samples, PREDICTED_SECONDS))
    speed = tokens / seconds if tokens and seconds else None
    return DFlashStats(
        drafts=drafts_i, drafted=drafted_i, accepted=accepted_i,
        acceptance_rate=accepted_i / drafted_i if drafted_i else None,
        mean_accepted=accepted_i / drafts_i if drafts_i else None,
        mean_acceptance_length=1 + accepted_i / drafts_i if drafts_i else None,
        accepted_per_position=per_pos_list, tokens_per_second=speed,
    )


def delta(before: DFlashStats | None, after: DFlashStats | None) -> dict[str, Any]:
    """Drafted and accepted tokens, verification steps and accepted tokens per draft position
    between two readings (one request's share, `buun bench`); {} when either is missing or a
    counter went back."""
    if before is None or after is None:
        return {}
    pb, pa = before.accepted_per_position, after.accepted_per_position
    out = {"drafted": after.drafted - before.drafted, "accepted": after.accepted - before.accepted,
           "steps": after.drafts - before.drafts,
           "accepted_per_pos": [pa[i] - (pb[i] if i < len(pb) else 0) for i in range(len(pa))]}
    if min(out["drafted"], out["accepted"], out["steps"], *out["accepted_per_pos"]) < 0:
        return {}  # a counter went back (the server restarted between the readings): no share to take
    return out
