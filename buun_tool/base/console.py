"""Output: data on stdout, progress and diagnostics on stderr (so `--json` output stays clean).

Messages are printed as literal text: they carry paths, YAML parser messages and llama-server
lines, whose `[` and `]` rich would otherwise read as markup and drop. Neither stream wraps
lines itself (soft_wrap): a terminal wraps long lines on its own. Where the output is not a
terminal (a CI log, a pipe) rich would lay tables out for 80 columns and cut or fold a path
in them: there the width has no limit, and every line keeps its length. On a terminal, a table
(console.Table) folds what does not fit its column instead of cutting it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.table import Table as _RichTable
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


class Table(_RichTable):
    """buun's tables: a value too long for its column (a path, a recipe's name, a number on a
    narrow terminal) goes on over the next lines of the cell, whole, where rich's default cut it
    with '…'."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


# C0 controls but tab and newline, DEL and C1 controls. Lines of a server's log carry text its clients
# chose (llama-server's warnings quote fields of a request); rich passes ESC through, so such a line
# printed as it is could drive the terminal: move the cursor, rewrite what is shown, set the title.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character shown as `\\xNN` instead of sent to the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def labelled(label: str, style: str, message: str) -> Text:
    """`label message` with only the label styled; the message is never read as markup, nor sent
    to the terminal as control characters (an error may quote a server's output)."""
    return Text.assemble((label, style), " ", printable(message))


def info(message: str) -> None:
    err.print(Text(printable(message)))


def step(message: str) -> None:
    err.print(labelled("==>", "bold cyan", message))


def ok(message: str) -> None:
    err.print(labelled("ok", "green", message))


def warn(message: str) -> None:
    err.print(labelled("warning:", "yellow", message))


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))
