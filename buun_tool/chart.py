"""Grouped bar charts written straight to PNG: numpy for the pixels, zlib for the file.

`buun bench` draws its AR-vs-DFlash chart with this so that no plotting library is needed on
the GPU machines (which get only buun's own dependencies). Text uses the 5x7 bitmap font in
data/font5x7.txt, upper case.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

FONT_FILE = Path(__file__).parent / "data" / "font5x7.txt"
GLYPH_W, GLYPH_H = 5, 7
INK = (30, 30, 30)
GRID = (225, 225, 225)
# AR first (grey), then one colour per DFlash configuration.
PALETTE = ((140, 140, 140), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189))


@cache
def _font() -> dict[str, np.ndarray]:
    glyphs: dict[str, np.ndarray] = {}
    name, rows = None, []
    for line in FONT_FILE.read_text().splitlines():
        if line.startswith("#") and name is None:
            continue
        if line.startswith("=") and len(line) == 2:
            name, rows = line[1], []
            continue
        rows.append([c == "#" for c in line])
        if name is not None and len(rows) == GLYPH_H:
            glyphs[name] = np.array(rows, dtype=bool)
            name = None
    return glyphs


class Canvas:
    def __init__(self, width: int, height: int):
        self.px = np.full((height, width, 3), 255, dtype=np.uint8)

    @property
    def width(self) -> int:
        return self.px.shape[1]

    @property
    def height(self) -> int:
        return self.px.shape[0]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        x0, x1 = sorted((max(0, x0), min(self.width, x1)))
        y0, y1 = sorted((max(0, y0), min(self.height, y1)))
        self.px[y0:y1, x0:x1] = color

    def text(self, x: int, y: int, s: str, scale: int = 2, color: tuple[int, int, int] = INK) -> None:
        font = _font()
        for i, ch in enumerate(s.upper()):
            glyph = font.get(ch, font["?"])
            block = np.kron(glyph, np.ones((scale, scale), dtype=bool))
            gx = x + i * (GLYPH_W + 1) * scale
            h, w = block.shape
            if gx < 0 or y < 0 or gx + w > self.width or y + h > self.height:
                continue
            self.px[y:y + h, gx:gx + w][block] = color

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + row.tobytes() for row in self.px)  # filter 0 on every row

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        return b"\x89PNG\r\n\x1a\n" + body


def text_width(s: str, scale: int = 2) -> int:
    return len(s) * (GLYPH_W + 1) * scale


def nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^k at or above value (the top of the y axis)."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if m * base >= value)


def _label(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def bar_chart(path: Path, title: str, groups: Sequence[str], series: Sequence[str],
              values: Sequence[Sequence[float | None]], subtitle: str = "", y_label: str = "",
              notes: Sequence[Sequence[str]] | None = None) -> Path:
    """Write a grouped bar chart: one cluster per group, one bar per series (values[group][series]).
    `notes[group][series]`, when given, is written in white inside the top of its bar (a speedup)."""
    n_groups, n_series = len(groups), len(series)
    bar_w, gap = 34, 40
    left, right, top, bottom = 90, 30, 70 + 18 * n_series, 60
    plot_w = n_groups * (n_series * bar_w + gap) + gap
    c = Canvas(max(left + plot_w + right, 520), top + 300 + bottom)
    plot_h = c.height - top - bottom
    y_max = nice_max(max((v for row in values for v in row if v is not None), default=1.0) * 1.1)

    c.text(left, 12, title, 2)
    c.text(left, 34, subtitle, 1)
    _legend(c, left, 50, series)
    _y_axis(c, left, top, plot_h, plot_w, y_max, y_label)
    for g, name in enumerate(groups):
        x = left + gap + g * (n_series * bar_w + gap)
        for s in range(n_series):
            v = values[g][s]
            if v is None:
                continue
            h = int(round(plot_h * v / y_max))
            bx = x + s * bar_w
            c.rect(bx + 2, top + plot_h - h, bx + bar_w - 2, top + plot_h, PALETTE[s % len(PALETTE)])
            label = _label(v)
            c.text(bx + (bar_w - text_width(label, 1)) // 2, top + plot_h - h - 10, label, 1)
            note = notes[g][s] if notes else ""
            if note and h > 16:
                c.text(bx + (bar_w - text_width(note, 1)) // 2, top + plot_h - h + 5, note, 1, (255, 255, 255))
        cluster = n_series * bar_w
        c.text(x + (cluster - text_width(name, 1)) // 2, top + plot_h + 10, name, 1)
    path.write_bytes(c.png())
    return path


def _legend(c: Canvas, x: int, y: int, series: Sequence[str]) -> None:
    for s, name in enumerate(series):
        c.rect(x, y + 18 * s, x + 12, y + 18 * s + 12, PALETTE[s % len(PALETTE)])
        c.text(x + 20, y + 18 * s, name, 2 if len(name) < 40 else 1)


def _y_axis(c: Canvas, left: int, top: int, plot_h: int, plot_w: int, y_max: float, y_label: str) -> None:
    for i in range(6):
        v = y_max * i / 5
        y = top + plot_h - int(round(plot_h * i / 5))
        c.rect(left, y, left + plot_w, y + 1, GRID)
        label = f"{v:.0f}" if y_max >= 10 else f"{v:.2g}"
        c.text(left - 8 - text_width(label, 1), y - 3, label, 1)
    c.rect(left, top, left + 1, top + plot_h + 1, INK)
    c.rect(left, top + plot_h, left + plot_w, top + plot_h + 1, INK)
    if y_label:
        c.text(8, top - 14, y_label, 1)
