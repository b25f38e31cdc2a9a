"""Benchmark charts drawn with matplotlib (the optional `bench` extra), off-screen, to PNG.

    require()                                   NotReadyError naming `pip install -e '.[bench]'` without it
    grouped_bars(title, groups, series, values) one cluster per group, one bar per series
    line_chart(title, x_label, y_label, lines)  one line per series, optional reference lines
    twin_line_chart(title, x_label, left, right) lines against two y axes (left and right)
    png(fig) -> bytes / save(fig, path)

Figures are built on matplotlib's object API (Figure + the Agg canvas), never pyplot, so no
display, GUI backend or global figure state is involved. matplotlib is imported only when a chart
is drawn: `buun bench` runs and writes its JSON without it.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from buun_tool.base.errors import NotReadyError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install -e '.[bench]' in the buun checkout (matplotlib) for charts and the HTML report"
# AR first (grey), then one colour per DFlash configuration (matplotlib's tab10 without its grey).
PALETTE = ("#8c8c8c", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf")


def require() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NotReadyError("charts need matplotlib, which is not installed", INSTALL_HINT) from None


def _figure(width: float, height: float) -> Figure:
    require()
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # every text is literal: labels carry names from a bench.json anyone may send, and a `$` pair in
    # them was read as mathtext (a malformed one a ValueError when drawn). Read when each text is
    # made, ticks' at drawing time included, so set for the process: buun's charts are its only figures.
    matplotlib.rcParams["text.parse_math"] = False

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def grouped_bars(title: str, groups: Sequence[str], series: Sequence[str], values: Sequence[Sequence[float | None]],
                 subtitle: str = "", y_label: str = "", notes: Sequence[Sequence[str]] | None = None,
                 colors: Sequence[str] = PALETTE) -> Figure:
    """values[group][series]; None leaves a gap. Each bar carries its value above it and
    `notes[group][series]` (a speedup, a ratio) inside it."""
    n_series = max(len(series), 1)
    width = 0.8 / n_series
    fig = _figure(max(7.0, 1.2 + len(groups) * (0.5 + 0.45 * n_series)), 4.6)
    ax = fig.add_subplot()
    for s, name in enumerate(series):
        xs = [g + (s - (n_series - 1) / 2) * width for g in range(len(groups))]
        heights = [values[g][s] for g in range(len(groups))]
        bars = ax.bar([x for x, h in zip(xs, heights, strict=True) if h is not None],
                      [h for h in heights if h is not None], width * 0.92, label=name, color=colors[s % len(colors)])
        shown = [g for g, h in enumerate(heights) if h is not None]
        ax.bar_label(bars, [_label(heights[g]) for g in shown], padding=2, fontsize=8)
        if notes:
            ax.bar_label(bars, [notes[g][s] for g in shown], label_type="center", color="white",
                         fontsize=8, fontweight="bold")
    ax.set_xticks(range(len(groups)), [_wrap(g, 18) for g in groups])
    ax.set_ylabel(y_label)
    ax.margins(y=0.12)  # room for the value labels above the tallest bar
    ax.grid(axis="y", color="#e0e0e0")
    ax.set_axisbelow(True)
    return _finish(fig, ax, title, subtitle)


@dataclass(frozen=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    style: str = "-o"  # matplotlib format: "-o" measured points, "--" a bound or reference
    color: str | None = None


def _plot(ax: Axes, lines: Sequence[Line], first: int = 0) -> None:
    """Each line in its colour, or the palette's from position `first` on (AR's grey left out)."""
    for i, line in enumerate(lines, start=first):
        ax.plot(line.xs, line.ys, line.style, label=line.label, color=line.color or PALETTE[(i + 1) % len(PALETTE)],
                markersize=4)


def line_chart(title: str, x_label: str, y_label: str, lines: Sequence[Line], subtitle: str = "",
               x_lim: tuple[float, float] | None = None, y_min: float | None = None) -> Figure:
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    _plot(ax, lines)
    if x_lim:
        ax.set_xlim(*x_lim)
    if y_min is not None:
        ax.set_ylim(bottom=y_min)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(color="#e0e0e0")
    return _finish(fig, ax, title, subtitle)


@dataclass(frozen=True)
class Axis:
    """One y axis of twin_line_chart: its label and its lines (from 0 up)."""

    label: str
    lines: Sequence[Line]


def twin_line_chart(title: str, x_label: str, left: Axis, right: Axis, subtitle: str = "",
                    x_ticks: Sequence[tuple[float, str]] = ()) -> Figure:
    """Two quantities of different units over one x (tok/s and AL against a budget): `left` on the
    left y axis, `right` on the right one, one legend for both beside the plot."""
    fig = _figure(8.5, 4.6)
    ax = fig.add_subplot()
    twin = ax.twinx()
    _plot(ax, left.lines)
    _plot(twin, right.lines, first=len(left.lines))
    for axis, side in ((ax, left), (twin, right)):
        axis.set_ylabel(side.label)
        axis.set_ylim(0, axis.get_ylim()[1] * 1.05)  # from 0, with room above the highest marker
    if x_ticks:
        ax.set_xticks([x for x, _ in x_ticks], [text for _, text in x_ticks])
    ax.set_xlabel(x_label)
    ax.grid(color="#e0e0e0")
    _titles(fig, ax, title, subtitle)
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    # beyond the right axis's labels: the legend may not cover them
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=8, frameon=False)
    return fig


def _finish(fig: Figure, ax: Axes, title: str, subtitle: str) -> Figure:
    """Titles, and the legend beside the plot (never over the bars or lines)."""
    _titles(fig, ax, title, subtitle)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def _titles(fig: Figure, ax: Axes, title: str, subtitle: str) -> None:
    # wrapped by hand: long titles break onto a second line instead of running off the figure
    width = fig.get_figwidth()
    fig.suptitle(_wrap(title, int(width * 9)), fontsize=12, fontweight="bold")
    if subtitle:  # over the axes, which the legend leaves about two thirds of the width
        ax.set_title(_wrap(subtitle, int(width * 10)), fontsize=8, color="#555555")


def _wrap(text: str, width: int) -> str:
    """Each line of text wrapped: long titles and labels break instead of running off or overlapping."""
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save(fig: Figure, path: Path) -> Path:
    path.write_bytes(png(fig))
    return path
