"""The figures of a `buun bench` run, drawn from its JSON (a fresh run's or a recorded one).

    decode_speed(data)       tok/s per configuration with AR beside it, speedups in the bars
    acceptance(data)         acceptance per draft position, a line per DFlash row     (None: no DFlash row)
    al_sweep(data, bound)    tok/s against the synthetic AL, the bandwidth bound drawn (None: no synthetic AL)
    tree_sweep(data)         tok/s and AL against the tree budget, the profile's AL   (None: no tree sweep)
    best_tree_budget(data)   the sweep's fastest budget and its tok/s over the chain's (None: no tree sweep)
    peak_memory(data)        peak GPU MiB per configuration                           (None: not sampled)
    bound(data)              the bandwidth bound and a line saying where its figures come from

Every function reads what the run recorded and nothing else: a figure the run lacks is None,
for the caller to say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from buun_tool.measure import chart

if TYPE_CHECKING:
    from matplotlib.figure import Figure

AL_RANGE = (1.0, 10.0)  # the x axis of the AL sweep: from no draft accepted to a long accepted block


def subtitle(data: dict[str, Any]) -> str:
    gpu = ", ".join(g["name"] for g in data["machine"].get("gpus") or []) or f"CPU: {data['machine'].get('cpu')}"
    pin = str(data["llama_cpp"].get("pin") or "")[:7]
    return f"{gpu} - llama.cpp {pin} - {data['options'].get('models_note') or ''} - {data['created']}"


def _groups(data: dict[str, Any]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((row["suite"], row["mode"]) for row in data["summary"]))


def _labels(data: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(row["label"] for row in data["summary"]))


def build_of(row: dict[str, Any]) -> str:
    """Whose llama-server a row ran on: "buun", or "upstream" (`--against upstream`; runs before it: buun)."""
    return row.get("build") or "buun"


def ar_tps(data: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The AR decode tok/s of the row's build on the row's suite and mode; None without one."""
    ar = {c["name"] for c in data["configs"] if not c["spec"]}
    return next((r["decode_tps"] for r in data["summary"] if r["config"] in ar and build_of(r) == build_of(row)
                 and (r["suite"], r["mode"]) == (row["suite"], row["mode"]) and r["decode_tps"]), None)


def decode_speed(data: dict[str, Any]) -> Figure:
    labels, groups = _labels(data), _groups(data)
    by_key = {(row["label"], row["suite"], row["mode"]): row for row in data["summary"]}
    values, notes = [], []
    for suite, mode in groups:
        cells = [by_key.get((label, suite, mode)) for label in labels]
        values.append([c["decode_tps"] if c else None for c in cells])
        notes.append([f"{c['speedup']:.2f}x" if c and c["speedup"] else "" for c in cells])
    return chart.grouped_bars("Decode tok/s: AR vs DFlash (speedup over AR in the bars)",
                              [f"{s} {m}" for s, m in groups], labels, values, subtitle=subtitle(data),
                              y_label="decode tok/s", notes=notes)


def acceptance(data: dict[str, Any]) -> Figure | None:
    rows = [r for r in data["summary"] if r["accept_per_pos"]]
    if not rows:
        return None
    several = len(_groups(data)) > 1
    colors = {label: chart.PALETTE[i % len(chart.PALETTE)] for i, label in enumerate(_labels(data))}
    lines = [chart.Line(r["label"] + (f" - {r['suite']} {r['mode']}" if several else ""),
                        list(range(1, len(r["accept_per_pos"]) + 1)), r["accept_per_pos"], color=colors[r["label"]])
             for r in rows]
    return chart.line_chart("Acceptance per draft position", "draft position",
                            "accepted tokens per verify step", lines, subtitle=subtitle(data), y_min=0)


@dataclass(frozen=True)
class Bound:
    """tok/s a step cannot beat: each step reads every weight once, so at most AL tokens per
    (bytes read / memory bandwidth) seconds."""

    bandwidth_gbs: float
    step_bytes: int  # the target's weights + the drafter's, read once per DFlash step

    def tps(self, al: float) -> float:
        return al * self.bandwidth_gbs * 1e9 / self.step_bytes


def bound(data: dict[str, Any]) -> tuple[Bound | None, str]:
    lim = data.get("limits") or {}
    if not lim:
        return None, ("bandwidth bound not drawn: this run (an earlier bench format) does not record the card's "
                      "memory bandwidth or the weights a step reads")
    bw, target, drafter = lim.get("bandwidth_gbs"), lim.get("target_bytes"), lim.get("drafter_bytes")
    missing = []
    if bw is None:
        missing.append(f"the card's memory bandwidth ({lim.get('bandwidth_source')})")
    if target is None:
        missing.append(f"the weights a step reads ({lim.get('weights_source')})")
    if missing:
        return None, "bandwidth bound not drawn: the run does not record " + " or ".join(missing)
    b = Bound(float(bw), int(target) + int(drafter or 0))
    return b, (f"bandwidth bound: AL x {b.bandwidth_gbs:g} GB/s ({lim.get('bandwidth_source')}) / "
               f"{b.step_bytes / 1e9:.2f} GB read per step ({lim.get('weights_source')}: target "
               f"{int(target) / 1e9:.2f} GB + drafter {int(drafter or 0) / 1e9:.2f} GB)")


def _sweep_rows(data: dict[str, Any], x: dict[str, float], group: tuple[str, str]) -> list[dict[str, Any]]:
    """A sweep's summary rows of one suite and mode with a decode speed, in the order of x (by config)."""
    return sorted((r for r in data["summary"] if r["config"] in x and (r["suite"], r["mode"]) == group
                   and r["decode_tps"]), key=lambda r: x[r["config"]])


def al_sweep(data: dict[str, Any], b: Bound | None) -> Figure | None:
    synthetic = {c["name"]: c["synthetic_al"] for c in data["configs"] if c.get("synthetic_al") is not None}
    if not synthetic:
        return None
    lines = []
    builds = list(dict.fromkeys(build_of(r) for r in data["summary"]))
    for i, (build, (suite, mode)) in enumerate((b, g) for b in builds for g in _groups(data)):
        rows = sorted((r for r in data["summary"] if r["config"] in synthetic and build_of(r) == build
                       and (r["suite"], r["mode"]) == (suite, mode) and r["decode_tps"]),
                      key=lambda r: synthetic[r["config"]])
        if not rows:
            continue
        # x is the AL the server measured (the forced one when /metrics gave none)
        xs = [r["mean_al"] if r["mean_al"] else synthetic[r["config"]] for r in rows]
        color = chart.PALETTE[(2 * i + 1) % len(chart.PALETTE)]
        name = f"{suite} {mode}" + ("" if build == "buun" else f", {build}")
        lines.append(chart.Line(f"DFlash {name}", xs, [r["decode_tps"] for r in rows], color=color))
        ar = ar_tps(data, rows[0])
        if ar:
            lines.append(chart.Line(f"AR {name}", list(AL_RANGE), [ar, ar], style=":", color=color))
    if b is not None:
        xs = [AL_RANGE[0] + k * (AL_RANGE[1] - AL_RANGE[0]) / 18 for k in range(19)]
        lines.append(chart.Line(f"bandwidth bound ({b.bandwidth_gbs:g} GB/s)", xs, [b.tps(x) for x in xs],
                                style="--", color="#000000"))
    return chart.line_chart("Decode tok/s against mean acceptance length (synthetic)", "mean acceptance length",
                            "decode tok/s", lines, subtitle=subtitle(data), x_lim=AL_RANGE, y_min=0)


def tree_budgets(data: dict[str, Any]) -> dict[str, int]:
    """The tree sweep's configurations (`buun bench --tree-budget`) and their budgets (0: the chain)."""
    return {c["name"]: c["tree_budget"] for c in data["configs"] if c.get("tree_budget") is not None}


def tree_profiled(data: dict[str, Any]) -> bool:
    """Whether the tree sweep ran under the calibrated synthetic profile (random weights), not the
    drafter's own acceptance: its servers' argv say so."""
    # argv is null where no server was started (--url)
    return any("--spec-synth-tree" in (c.get("argv") or []) for c in data["configs"]
               if c.get("tree_budget") is not None)


def tree_vs_chain(data: dict[str, Any]) -> list[tuple[dict[str, Any], int, float | None]]:
    """The tree sweep's summary rows in budget order, each with its budget and its decode tok/s
    over the chain's on the same suite and mode (None where either has none)."""
    budgets = tree_budgets(data)
    sweep = sorted((r for r in data["summary"] if r["config"] in budgets), key=lambda r: budgets[r["config"]])
    chain = {(r["suite"], r["mode"]): r["decode_tps"] for r in sweep if budgets[r["config"]] <= 1}
    out = []
    for r in sweep:
        base = chain.get((r["suite"], r["mode"]))
        out.append((r, budgets[r["config"]], r["decode_tps"] / base if base and r["decode_tps"] else None))
    return out


def best_tree_budget(data: dict[str, Any]) -> tuple[int, float] | None:
    """The sweep's fastest budget and its tok/s over the chain's, the mean over the suites and
    modes run (the chain: budget 0, 1.0); None without a sweep or a chain to compare with."""
    ratios: dict[int, list[float]] = {}
    for _, budget, ratio in tree_vs_chain(data):
        if ratio is not None:
            ratios.setdefault(budget, []).append(ratio)
    if not ratios:
        return None
    budget = max(ratios, key=lambda b: (sum(ratios[b]) / len(ratios[b]), -b))  # a tie goes to the smaller tree
    return budget, sum(ratios[budget]) / len(ratios[budget])


def tree_sweep(data: dict[str, Any]) -> Figure | None:
    """Decode tok/s (left) and the measured AL (right) against the budget, a line per suite and
    mode, and the AL the profile expects (the same for every suite: it is what the server feigns)."""
    budgets = tree_budgets(data)
    if not budgets:
        return None
    speed, al = [], []
    for i, group in enumerate(_groups(data)):
        rows = _sweep_rows(data, budgets, group)
        color = chart.PALETTE[(2 * i + 1) % len(chart.PALETTE)]
        name = " ".join(group)
        speed.append(chart.Line(f"tok/s {name}", [budgets[r["config"]] for r in rows],
                                [r["decode_tps"] for r in rows], color=color))
        measured = [r for r in rows if r["mean_al"]]
        al.append(chart.Line(f"AL {name}", [budgets[r["config"]] for r in measured], [r["mean_al"] for r in measured],
                             style="--s", color=color))
    expected = sorted((c["tree_budget"], c["expected_al"]) for c in data["configs"]
                      if c.get("tree_budget") is not None and c.get("expected_al") is not None)
    if expected:
        al.append(chart.Line("AL the profile expects", [b for b, _ in expected], [e for _, e in expected],
                             style=":^", color="#000000"))
    ticks = [(b, "chain" if b <= 1 else str(b)) for b in sorted(set(budgets.values()))]
    title = "synthetic tree profile" if tree_profiled(data) else "the drafter's acceptance"
    return chart.twin_line_chart(f"Tree budget sweep: decode tok/s and acceptance length ({title})",
                                 "tree budget (draft nodes verified per step)", chart.Axis("decode tok/s", speed),
                                 chart.Axis("mean acceptance length", al), subtitle=subtitle(data), x_ticks=ticks)


def peak_memory(data: dict[str, Any]) -> Figure | None:
    configs = [c for c in data["configs"] if c.get("peak_gpu_mib") is not None]
    if not configs:
        return None
    labels = _labels(data)
    # one bar per configuration, in the colours of the speed chart
    values = [[next((c["peak_gpu_mib"] for c in configs if c["label"] == label), None) for label in labels]]
    return chart.grouped_bars("Peak GPU memory per configuration (nvidia-smi, all GPUs)", ["peak GPU memory"],
                              labels, values, subtitle=subtitle(data), y_label="MiB")
