"""What `buun bench` prints of a run: its table, the table of requests sent at once, the acceptance
by draft position and the verdict of a tree sweep.

    table(result) / concurrency_table(result) -> Table (None: no requests at once)
    per_position(result) -> [line]      tree_verdict(data) -> line | None
"""

from __future__ import annotations

from typing import Any

from buun_tool.measure import figures
from buun_tool.measure.bench_record import BenchResult


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _times(v: float | None) -> str:
    return _fmt(v, ".2f") + ("x" if v else "")


def concurrency_table(result: BenchResult) -> Any:
    """The rows of requests sent at once: per request and aggregate tok/s, and the ratios the slots
    are judged by; None when the run sent one request at a time."""
    from buun_tool.base.console import Table

    rows = [r for r in result.rows if r.get("concurrency", 1) > 1]
    if not rows:
        return None
    t = Table(title="several requests at once", header_style="bold", box=None)
    for col in ("config", "suite", "mode", "at once", "per request tok/s", "aggregate tok/s", "AL",
                "vs one slot", "vs AR at once", "served tok/s", "served vs one slot"):
        t.add_column(col, justify="left" if col in ("config", "suite", "mode") else "right")
    for r in rows:
        t.add_row(r["label"], r["suite"], r["mode"], str(r["concurrency"]), _fmt(r["decode_tps"], ".1f"),
                  _fmt(r["aggregate_tps"], ".1f"), _fmt(r["mean_al"], ".2f"), _times(r.get("vs_one_slot")),
                  _times(r.get("vs_ar")), _fmt(r.get("served_tps"), ".1f"), _times(r.get("served_vs_one_slot")))
    return t


def table(result: BenchResult) -> Any:
    """One line a row of the summary: speeds, acceptance, speedups, peak GPU memory."""
    from buun_tool.base.console import Table

    t = Table(title="buun bench", header_style="bold", box=None)
    against = any(r.get("vs_upstream") for r in result.rows)
    for col in ("config", "suite", "mode", "n", "decode tok/s", "prompt tok/s", "TTFT ms", "drafted",
                "accepted", "AL", "accept", "speedup", *(("vs upstream",) if against else ()), "peak GPU MiB"):
        t.add_column(col, justify="left" if col in ("config", "suite", "mode") else "right")
    for r in result.rows:
        ratio = (_times(r.get("vs_upstream")),) if against else ()
        t.add_row(r["label"], r["suite"], r["mode"], str(r["requests"]), _fmt(r["decode_tps"], ".1f"),
                  _fmt(r["prompt_tps"], ".1f"), _fmt(r["ttft_ms"], ".0f"), str(r["drafted"]), str(r["accepted"]),
                  _fmt(r["mean_al"], ".2f"), _fmt(r["accept_rate"], ".0%"), _times(r["speedup"]), *ratio,
                  _fmt(r["peak_gpu_mib"], "d"))
    return t


def tree_verdict(data: dict[str, Any]) -> str | None:
    """After a tree sweep (a run's JSON): its fastest budget, and how to serve it; None without one."""
    best = figures.best_tree_budget(data)
    if best is None:
        return None
    budget, ratio = best
    measured = "under the synthetic tree profile" if figures.tree_profiled(data) else "on these models"
    if budget <= 1:
        return f"tree sweep: the chain is the fastest {measured}: keep the recipe's server.tree.budget 0"
    return (f"tree sweep: budget {budget} is the fastest {measured}, {ratio:.2f}x the chain's tok/s: serve it "
            f"with `buun serve --tree-budget {budget}` or the recipe's server.tree.budget")


def per_position(result: BenchResult) -> list[str]:
    """One line per DFlash row: acceptance rate at each draft position."""
    lines = []
    for r in result.rows:
        if r["accept_per_pos"]:
            cells = " ".join(f"{p:.2f}" for p in r["accept_per_pos"])
            lines.append(f"{r['label']} {r['suite']} {r['mode']}: {cells}")
    return lines
