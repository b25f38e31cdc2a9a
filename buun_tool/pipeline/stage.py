"""What a pipeline stage says about its own work: current, or stale with the reason.

Each stage answers from its own records: vendor from the tree's hash and the pin, patch from the
series in the tree, build from its stamp, pull from the manifests, drafter from the folder,
convert from the GGUF's provenance record. The stage's own command acts on that answer, and
`buun setup` only orders the stages and prints the plan from their answers, so the two cannot
disagree about whether a stage has work to do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageStatus:
    current: bool
    detail: str  # current: what is in place; stale: why the stage has work to do


def current(detail: str) -> StageStatus:
    return StageStatus(True, detail)


def stale(reason: str) -> StageStatus:
    return StageStatus(False, reason)
