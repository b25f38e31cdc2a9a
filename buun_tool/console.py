"""Output: data on stdout, progress and diagnostics on stderr (so `--json` output stays clean).

Messages are printed as literal text: they carry paths, YAML parser messages and llama-server
lines, whose `[` and `]` rich would otherwise read as markup and drop. Neither stream wraps
lines itself (soft_wrap): a terminal wraps long lines on its own. Where the output is not a
terminal (a CI log, a pipe) rich would lay tables out for 80 columns and cut or fold a path
in them: there the width has no limit, and every line keeps its length.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.text import Text

UNLIMITED = 1 << 20  # columns when the output is not a terminal


class _Console(Console):
    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        return size if self.is_terminal else ConsoleDimensions(UNLIMITED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


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
