"""`buun bench --compare A.json B.json`: two recorded runs side by side, each difference judged
against the run-to-run noise the runs themselves show.

    compare(a, b, a_path, b_path) -> Comparison     (then figure / table / to_json)

Noise of a row (configuration, suite, mode) in one run: the relative spread (max - min) / mean
of the decode tok/s of its requests. Where the run repeated each prompt (--repeats 2 or more) it
is the largest spread among the repeats of one prompt: the same request measured again. Where it
did not, it is the spread among its prompts, which also holds the prompts' own differences (an
upper figure). A difference |B / A - 1| is flagged when it is larger than the larger noise of the
two runs; a row with one request in both runs has no noise to judge by and is never flagged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buun_tool.base.errors import UsageError
from buun_tool.measure import chart, figures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from buun_tool.base.console import Table

Key = tuple[str, str, str]  # configuration, suite, mode


@dataclass(frozen=True)
class Noise:
    spread: float | None  # (max - min) / mean of decode tok/s; None: a single request
    basis: str  # "repeats", "prompts" or "one request"


def noise(data: dict[str, Any], key: Key) -> Noise:
    by_prompt: dict[str, list[float]] = {}
    for s in data["samples"]:
        # a request that decoded nothing has no speed to spread around (all of them such: a 0 / 0 spread)
        if (s["config"], s["suite"], s["mode"]) == key and s["decode_ms"] and s["decode_tokens"]:
            by_prompt.setdefault(s["prompt_id"], []).append(s["decode_tokens"] * 1000 / s["decode_ms"])

    def spread(values: list[float]) -> float:
        return (max(values) - min(values)) / (sum(values) / len(values))

    repeated = [v for v in by_prompt.values() if len(v) > 1]
    if repeated:
        return Noise(max(spread(v) for v in repeated), "repeats")
    singles = [v[0] for v in by_prompt.values()]
    return Noise(spread(singles), "prompts") if len(singles) > 1 else Noise(None, "one request")


@dataclass(frozen=True)
class Row:
    config: str
    suite: str
    mode: str
    label: str
    a_tps: float | None
    b_tps: float | None
    ratio: float | None  # B / A
    a_noise: Noise
    b_noise: Noise
    flagged: bool | None  # None: neither run shows its noise

    @property
    def threshold(self) -> float | None:
        return threshold(self.a_noise, self.b_noise)


def threshold(a: Noise, b: Noise) -> float | None:
    """The larger noise of the two runs: a difference within it is not told from a rerun."""
    known = [n.spread for n in (a, b) if n.spread is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class Comparison:
    a_name: str
    b_name: str
    rows: list[Row]
    warnings: list[str]


def _keys(data: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    return {(r["config"], r["suite"], r["mode"]): r for r in data["summary"]}


def _describe(keys: list[Key]) -> str:
    return ", ".join(f"{c} ({s} {m})" for c, s, m in keys)


def names(a_path: Path, b_path: Path) -> tuple[str, str]:
    """What the two runs are called: their folders (a bench's --out), else their file names."""
    a, b = a_path.resolve().parent.name, b_path.resolve().parent.name
    if a == b:
        a, b = a_path.name, b_path.name
    return (f"A: {a}", f"B: {b}") if a != b else ("A", "B")


def compare(a: dict[str, Any], b: dict[str, Any], a_path: Path, b_path: Path) -> Comparison:
    ka, kb = _keys(a), _keys(b)
    if set(ka) != set(kb):
        only_a, only_b = [k for k in ka if k not in kb], [k for k in kb if k not in ka]
        parts = ([f"only in {a_path}: {_describe(only_a)}"] if only_a else []) + \
                ([f"only in {b_path}: {_describe(only_b)}"] if only_b else [])
        raise UsageError("the two runs did not measure the same configurations; " + "; ".join(parts),
                         "compare runs made with the same --synthetic-al, --no-ar, --suite and --mode")
    warnings = [f"{what} differs: {a['options'].get(opt)!r} in A, {b['options'].get(opt)!r} in B"
                for opt, what in (("n_predict", "--n-predict"), ("prompts", "--prompts"), ("repeats", "--repeats"))
                if a["options"].get(opt) != b["options"].get(opt)]
    rows = []
    for key, ra in ka.items():
        rb = kb[key]
        ratio = rb["decode_tps"] / ra["decode_tps"] if ra["decode_tps"] and rb["decode_tps"] else None
        na, nb = noise(a, key), noise(b, key)
        limit = threshold(na, nb)
        flagged = None if limit is None or ratio is None else abs(ratio - 1) > limit
        rows.append(Row(*key, ra["label"], ra["decode_tps"], rb["decode_tps"], ratio, na, nb, flagged))
    return Comparison(*names(a_path, b_path), rows, warnings)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def figure(c: Comparison, a: dict[str, Any], b: dict[str, Any]) -> Figure:
    several = len({(r.suite, r.mode) for r in c.rows}) > 1
    groups = [r.label + (f"\n{r.suite} {r.mode}" if several else "") for r in c.rows]
    notes = [["", _pct(r.ratio - 1 if r.ratio else None) + (" !" if r.flagged else "")] for r in c.rows]
    return chart.grouped_bars("Decode tok/s, two runs side by side (B against A; ! beyond the runs' noise)", groups,
                              [c.a_name, c.b_name], [[r.a_tps, r.b_tps] for r in c.rows],
                              subtitle=f"A: {figures.subtitle(a)}\nB: {figures.subtitle(b)}", y_label="decode tok/s",
                              notes=notes, colors=(chart.PALETTE[0], chart.PALETTE[1]))


def _noise_text(n: Noise) -> str:
    return "-" if n.spread is None else f"{n.spread:.1%} ({n.basis})"


def table(c: Comparison) -> Table:
    from rich.text import Text

    from buun_tool.base.console import Table, printable

    t = Table(title=Text(f"{c.a_name}  vs  {c.b_name}"), header_style="bold", box=None)  # folder names: literal
    for col in ("config", "suite", "mode", "A tok/s", "B tok/s", "B/A", "noise A", "noise B", "verdict"):
        t.add_column(col, justify="left" if col in ("config", "suite", "mode", "verdict") else "right")
    for r in c.rows:
        verdict = Text("no noise measure" if r.flagged is None else "beyond noise" if r.flagged else "within noise",
                       "bold red" if r.flagged else "")
        # the names come from the files: literal text (a `[/]` in them was a rich MarkupError traceback),
        # and no control character reaches the terminal
        names = (Text(printable(v)) for v in (r.label, r.suite, r.mode))
        t.add_row(*names, "-" if r.a_tps is None else f"{r.a_tps:.1f}",
                  "-" if r.b_tps is None else f"{r.b_tps:.1f}", _pct(r.ratio - 1 if r.ratio else None),
                  _noise_text(r.a_noise), _noise_text(r.b_noise), verdict)
    return t


def to_json(c: Comparison) -> dict[str, Any]:
    return {"a": c.a_name, "b": c.b_name, "warnings": c.warnings,
            "rows": [{**asdict(r), "threshold": r.threshold} for r in c.rows]}
