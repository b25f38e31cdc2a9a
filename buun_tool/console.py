"""Output: data on stdout, progress and diagnostics on stderr (so `--json` output stays clean)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def info(message: str) -> None:
    err.print(message)


def step(message: str) -> None:
    err.print(f"[bold cyan]==>[/] {message}")


def ok(message: str) -> None:
    err.print(f"[green]ok[/] {message}")


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {message}")


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))
