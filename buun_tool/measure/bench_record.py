"""The record of a `buun bench` run: its result as bench.json holds it, and its chart.

    BenchResult.to_json() -> dict       bench.json's content (format FORMAT: bench_read.py reads it back)
    write_json(result, path) / write_chart(result, path)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from buun_tool.measure.bench_prompts import Prompt
from buun_tool.measure.bench_read import FORMAT
from buun_tool.measure.bench_run import ConfigRun


@dataclass
class BenchResult:
    created: str
    machine: dict[str, Any]
    llama_cpp: dict[str, Any]
    options: dict[str, Any]
    prompt_sources: dict[str, str]
    runs: list[ConfigRun]
    rows: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "created": self.created, "machine": self.machine, "llama_cpp": self.llama_cpp,
            "options": self.options, "prompt_sources": self.prompt_sources,
            "prompts": [asdict(p) for p in self.prompts], "limits": self.limits,
            "commands": {r.config.name: r.command for r in self.runs if r.command},
            "configs": [{**r.config.to_json(), "argv": r.command, "peak_gpu_mib": r.peak_gpu_mib,
                         "baseline_gpu_mib": r.baseline_gpu_mib} for r in self.runs],
            "summary": self.rows,
            "samples": [asdict(s) for r in self.runs for s in r.samples],
            "groups": [asdict(g) for r in self.runs for g in r.groups],
        }


def write_json(result: BenchResult, path: Path) -> Path:
    path.write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return path


def write_chart(result: BenchResult, path: Path) -> Path:
    """Decode tok/s per suite and mode, one bar per configuration, speedups written in the bars
    (needs matplotlib: chart.require() says how to get it)."""
    from buun_tool.measure import chart, figures

    return chart.save(figures.decode_speed(result.to_json()), path)
