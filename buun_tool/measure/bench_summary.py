"""The summary of a `buun bench` run: one row per (configuration, suite, mode), its speeds, its
acceptance and its ratios (over AR, over upstream's build, over one slot).

    summarize(runs) -> rows                    the rows, with speedup and vs_upstream
    row_of(run, suite, mode, samples) -> row    one row over the samples given (`buun tune`: all of a run's)
    with_concurrency(rows, runs) -> rows        each row's concurrency and aggregate tok/s, and its ratios
"""

from __future__ import annotations

from typing import Any

from buun_tool.measure import bench_configs
from buun_tool.measure.bench_run import ConfigRun, Sample


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def row_of(run: ConfigRun, suite: str, mode: str, samples: list[Sample]) -> dict[str, Any]:
    steps = sum(s.steps or 0 for s in samples) if all(s.steps is not None for s in samples) else None
    accepted = sum(s.accepted for s in samples)
    n_pos = max((len(s.accepted_per_pos) for s in samples), default=0)
    per_pos = [sum(s.accepted_per_pos[i] for s in samples if i < len(s.accepted_per_pos)) for i in range(n_pos)]
    ttfts = [s.ttft_ms for s in samples if s.ttft_ms is not None]
    walls = [s.wall_ms for s in samples if s.wall_ms is not None]
    return {
        "config": run.config.name, "label": run.config.label, "suite": suite, "mode": mode,
        "requests": len(samples),
        "decode_tps": _ratio(sum(s.decode_tokens for s in samples) * 1000, sum(s.decode_ms for s in samples)),
        "prompt_tps": _ratio(sum(s.prompt_tokens for s in samples) * 1000, sum(s.prompt_ms for s in samples)),
        "ttft_ms": sum(ttfts) / len(ttfts) if ttfts else None,
        # served: the tokens over the time from sending each request to its end (its prefill and
        # first token too); None for a run recorded without that time
        "served_tps": _ratio(sum(s.decode_tokens for s in samples) * 1000, sum(walls))
        if walls and len(walls) == len(samples) else None,
        "drafted": sum(s.drafted for s in samples), "accepted": accepted, "steps": steps,
        "mean_al": 1 + accepted / steps if steps else None,
        # a DFlash step (draft, verify, commit): the server's decode time over its verify steps
        "step_ms": sum(s.decode_ms for s in samples) / steps if steps else None,
        "accept_rate": _ratio(accepted, sum(s.drafted for s in samples)),
        "accept_per_pos": [p / steps for p in per_pos] if steps else [],
        "peak_gpu_mib": run.peak_gpu_mib, "build": run.config.build, "speedup": None, "vs_upstream": None,
    }


def summarize(runs: list[ConfigRun]) -> list[dict[str, Any]]:
    """One row per (configuration, suite, mode), with the speedup over the AR of the same build on
    the same prompts and, for a configuration run on both builds, buun's tok/s over upstream's."""
    rows = []
    for r in runs:
        keys = dict.fromkeys((s.suite, s.mode) for s in r.samples)
        for suite, mode in keys:
            rows.append(row_of(r, suite, mode, [s for s in r.samples if (s.suite, s.mode) == (suite, mode)]))
    ar_names = {r.config.name for r in runs if r.config.name in ("ar", bench_configs.upstream_name("ar"))}
    ar = {(row["build"], row["suite"], row["mode"]): row["decode_tps"] for row in rows if row["config"] in ar_names}
    tps = {(row["config"], row["suite"], row["mode"]): row["decode_tps"] for row in rows}
    for row in rows:
        base = ar.get((row["build"], row["suite"], row["mode"]))
        if row["config"] not in ar_names and base and row["decode_tps"]:
            row["speedup"] = row["decode_tps"] / base
        twin = tps.get((bench_configs.upstream_name(row["config"]), row["suite"], row["mode"]))
        if row["build"] == "buun" and twin and row["decode_tps"]:
            row["vs_upstream"] = row["decode_tps"] / twin
    return rows


def with_concurrency(rows: list[dict[str, Any]], runs: list[ConfigRun]) -> list[dict[str, Any]]:
    """Each row with its concurrency and aggregate decode tok/s: for requests sent at once, the
    tokens all of them generated over the time they took together, with the acceptance length of
    the server's verify steps; for one at a time, its decode tok/s. A DFlash row at a concurrency
    of N also gets its aggregate over the same DFlash configuration's one-slot tok/s (`vs_one_slot`)
    and over AR's aggregate at N (`vs_ar`): the targets of several slots; its speedup is over AR's
    requests at N, not over AR alone. The aggregate's time starts at a group's first token, so a
    slower first token hides more of the others' prefill before it: `served_tps` takes the time from
    the sending instead, one slot's too, and `served_vs_one_slot` is their ratio."""
    by_name = {r.config.name: r for r in runs}
    for row in rows:
        run = by_name.get(row["config"])
        n = run.config.concurrency if run else 1
        row["concurrency"] = n
        if n == 1:
            row["aggregate_tps"] = row["decode_tps"]
            continue
        groups = [g for g in run.groups if (g.suite, g.mode) == (row["suite"], row["mode"])]
        row["aggregate_tps"] = _ratio(sum(g.decode_tokens for g in groups) * 1000, sum(g.window_ms for g in groups))
        spans = [g.span_ms for g in groups]
        row["served_tps"] = _ratio(sum(g.decode_tokens for g in groups) * 1000, sum(spans)) \
            if groups and all(s is not None for s in spans) else None
        steps = [g.steps for g in groups]
        if steps and all(s is not None for s in steps) and sum(steps):
            row["steps"] = sum(steps)
            row["mean_al"] = 1 + sum(g.accepted for g in groups) / sum(steps)
    index = {(r["config"], r["suite"], r["mode"]): r for r in rows}
    for row in rows:
        run = by_name.get(row["config"])
        if run is None or row["concurrency"] == 1:
            continue
        one = index.get((run.config.name.removesuffix(f"-c{row['concurrency']}"), row["suite"], row["mode"]))
        ar = index.get((f"ar-c{row['concurrency']}", row["suite"], row["mode"]))
        # a request's speed against AR's, each with as many others at once
        row["speedup"] = _ratio(row["decode_tps"] or 0, ar["decode_tps"] or 0) if run.config.spec and ar else None
        if run.config.spec and one and one["decode_tps"] and row["aggregate_tps"]:
            row["vs_one_slot"] = row["aggregate_tps"] / one["decode_tps"]
        if run.config.spec and one and one.get("served_tps") and row.get("served_tps"):
            row["served_vs_one_slot"] = row["served_tps"] / one["served_tps"]
        if run.config.spec and ar and ar["aggregate_tps"] and row["aggregate_tps"]:
            row["vs_ar"] = row["aggregate_tps"] / ar["aggregate_tps"]
    return rows
