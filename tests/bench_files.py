"""Recorded `buun bench` runs under docs/results/ and helpers for the tests that read them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from buun_tool.cli.app import app

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
RECORDED = RESULTS / "h100-2026-11-27-pdl" / "bench-all-1" / "bench.json"  # format 1: before the report
TWIN = RESULTS / "h100-2026-11-27-targets" / "bench-all-1" / "bench.json"  # the same configurations as RECORDED
OTHER_CONFIGS = RESULTS / "h200-2026-11-26" / "bench-cd256.json"  # no AR row
# the python of the tests with matplotlib made unimportable, as on a machine without the bench extra
NO_MATPLOTLIB = [sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
                 "from buun_tool.cli.app import main; sys.argv[0] = 'buun'; main()"]


def bench_cli(*args: str) -> Any:
    """`buun bench ARGS` in-process."""
    return CliRunner().invoke(app, ["bench", *args])


def said(text: str) -> str:
    """What the CLI printed, with rich's line wrapping undone."""
    return " ".join(text.split())


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path
