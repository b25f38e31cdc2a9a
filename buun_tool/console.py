"""Output: data on stdout, progress and diagnostics on stderr (so `--json` output stays clean).

Messages are printed as literal text: they carry paths, YAML parser messages and llama-server
lines, whose `[` and `]` rich would otherwise read as markup and drop. Neither stream wraps
lines itself (soft_wrap): a path or message in a CI log or a pipe stays whole, and a terminal
wraps long lines on its own.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def labelled(label: str, style: str, message: str) -> Text:
    """`label message` with only the label styled; the message is never read as markup."""
    return Text.assemble((label, style), " ", message)


def info(message: str) -> None:
    err.print(Text(message))


def step(message: str) -> None:
    err.print(labelled("==>", "bold cyan", message))


def ok(message: str) -> None:
    err.print(labelled("ok", "green", message))


def warn(message: str) -> None:
    err.print(labelled("warning:", "yellow", message))


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))
