"""`buun bench --report` / `--report-from FILE.json`: one self-contained HTML file of a run.

    write(data, path, bandwidth_gbs=None) -> path      data: bench.json's content (bench.read_json)

Charts are PNGs embedded as data: URIs and the style sheet is inline, so the file opens anywhere,
offline, and loads nothing. Sections: decode speed with AR beside each configuration, acceptance
per draft position, tok/s against the synthetic AL with the card's bandwidth bound, peak GPU
memory, the tree budget sweep and the slots/concurrency curve, then the machine, the build, the
exact server commands and the prompts. A section whose data the run lacks says "not run" in one
line; a figure the run does not record (the bandwidth, the weights a step reads) is named as
missing, never guessed.
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buun_tool.base import fsutil
from buun_tool.measure import bench, chart, figures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.sub, .note { color: #555; } .not-run { color: #777; font-style: italic; }
img { max-width: 100%; display: block; margin: 1em 0; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 0.25em 0.7em; text-align: right; vertical-align: top; }
th { background: #f5f5f5; } td.l, th.l { text-align: left; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
nav a { margin-right: 1em; }
"""

# (id, title) of every section, in order; the test checks each is present
SECTIONS = (("speed", "Decode speed"), ("acceptance", "Acceptance per draft position"),
            ("al-sweep", "Decode speed against acceptance length"), ("memory", "Peak GPU memory"),
            ("tree", "Tree budget sweep"), ("concurrency", "Slots and concurrency"), ("machine", "Machine"),
            ("build", "Build"), ("commands", "Server commands"), ("prompts", "Prompts"))


def _e(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _num(v: Any, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _img(fig: Figure, ident: str, alt: str) -> str:
    data = base64.b64encode(chart.png(fig)).decode()
    return f'<img id="chart-{ident}" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(ident: str, head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """rows hold escaped cells; the first `left` columns are text, the others numbers."""
    def cells(tag: str, values: list[str]) -> str:
        return "".join(f'<{tag}{" class=l" if i < left else ""}>{v}</{tag}>' for i, v in enumerate(values))
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f'<table id="table-{ident}"><thead><tr>{cells("th", [_e(h) for h in head])}</tr></thead>' \
           f"<tbody>{body}</tbody></table>"


def _not_run(text: str) -> str:
    return f'<p class="not-run">{_e(text)}</p>'


def _speed(data: dict[str, Any]) -> str:
    against = any(r.get("vs_upstream") for r in data["summary"])  # --against upstream: buun over upstream
    rows = [[_e(r["label"]), _e(r["suite"]), _e(r["mode"]), _e(r["requests"]), _num(r["decode_tps"], ".1f"),
             _num(figures.ar_tps(data, r), ".1f"), _num(r["speedup"], ".2f", "x"),
             *([_num(r.get("vs_upstream"), ".2f", "x")] if against else []), _num(r["mean_al"], ".2f"),
             _num(r.get("accept_rate"), ".0%"), _num(r.get("ttft_ms"), ".0f"), _num(r.get("prompt_tps"), ".1f"),
             _num(r["peak_gpu_mib"], "d")] for r in data["summary"]]
    head = ["configuration", "suite", "mode", "requests", "decode tok/s", "AR tok/s", "speedup",
            *(["buun / upstream"] if against else []), "mean AL", "accepted", "TTFT ms", "prompt tok/s",
            "peak GPU MiB"]
    return _img(figures.decode_speed(data), "speed", "decode tok/s per configuration") + \
        _table("speed", head, rows, left=3)


def _acceptance(data: dict[str, Any]) -> str:
    fig = figures.acceptance(data)
    if fig is None:
        return _not_run("Not run: no DFlash configuration in this run.")
    spec = [r for r in data["summary"] if r["accept_per_pos"]]
    n = max(len(r["accept_per_pos"]) for r in spec)
    rows = [[_e(r["label"]), _e(r["suite"]), _e(r["mode"]), *(_num(p, ".2f") for p in r["accept_per_pos"]),
             *(["-"] * (n - len(r["accept_per_pos"])))] for r in spec]
    note = '<p class="note">Accepted tokens at each draft position per verify step (from /metrics).</p>'
    return note + _img(fig, "acceptance", "acceptance per draft position") + \
        _table("acceptance", ["configuration", "suite", "mode", *map(str, range(1, n + 1))], rows, left=3)


def _al_sweep(data: dict[str, Any]) -> str:
    bound, bound_note = figures.bound(data)
    fig = figures.al_sweep(data, bound)
    if fig is None:
        return _not_run("Not run: no configuration with a synthetic acceptance length "
                        "(buun bench --synthetic-al 1 --synthetic-al 2 ... up to 10).")
    synthetic = {c["name"]: c["synthetic_al"] for c in data["configs"] if c.get("synthetic_al") is not None}
    rows = []
    for r in (r for r in data["summary"] if r["config"] in synthetic):
        al = r["mean_al"] or synthetic[r["config"]]
        limit = bound.tps(al) if bound else None
        share = r["decode_tps"] / limit if limit and r["decode_tps"] else None
        rows.append([_e(r["label"]), _e(r["suite"]), _e(r["mode"]), _num(synthetic[r["config"]], "g"),
                     _num(r["mean_al"], ".2f"), _num(r["decode_tps"], ".1f"), _num(limit, ".0f"), _num(share, ".0%")])
    head = ["configuration", "suite", "mode", "forced AL", "measured AL", "decode tok/s", "bound tok/s",
            "of bound"]
    return f'<p class="note" id="bound-note">{_e(bound_note)}</p>' + \
        _img(fig, "al-sweep", "decode tok/s against acceptance length") + _table("al-sweep", head, rows, left=3)


def _tree(data: dict[str, Any]) -> str:
    fig = figures.tree_sweep(data)
    if fig is None:
        return _not_run("Not run: no tree budget sweep in this run (buun bench --tree-budget 8,16,22,32).")
    expected = {c["name"]: c.get("expected_al") for c in data["configs"]}
    rows = [[_e(r["label"]), _e(r["suite"]), _e(r["mode"]), _num(budget, "d"), _num(expected[r["config"]], ".2f"),
             _num(r["mean_al"], ".2f"), _num(r.get("step_ms"), ".2f"), _num(r["decode_tps"], ".1f"),
             _num(ratio, ".2f", "x")] for r, budget, ratio in figures.tree_vs_chain(data)]
    head = ["configuration", "suite", "mode", "budget", "expected AL", "measured AL", "step ms", "decode tok/s",
            "vs chain"]
    served = ("with the calibrated synthetic tree profile (--spec-synth-tree; docs/tree.md): the expected AL is "
              "the profile's for that budget" if figures.tree_profiled(data) else
              "with the drafter's own acceptance on these models and prompts")
    note = (f'<p class="note">Every budget, the chain (0) included, served {served}; a step is the decode time '
            "over the verify steps (draft, verify and commit).</p>")
    return note + _img(fig, "tree", "decode tok/s and acceptance length against the tree budget") + \
        _table("tree", head, rows, left=3)


def _memory(data: dict[str, Any]) -> str:
    fig = figures.peak_memory(data)
    if fig is None:
        return _not_run("Not measured: no GPU memory was sampled (no nvidia-smi on the machine).")
    rows = [[_e(c["label"]), _num(c["peak_gpu_mib"], "d"), _num(c.get("baseline_gpu_mib"), "d")]
            for c in data["configs"]]
    return _img(fig, "memory", "peak GPU memory per configuration") + \
        _table("memory", ["configuration", "peak GPU MiB", "before the server MiB"], rows)


def _concurrency(data: dict[str, Any]) -> str:
    """Requests sent at once to servers of as many slots (buun bench --concurrency N): each row's
    per-request and aggregate decode tok/s, and the aggregate against the same configuration on
    one slot and against AR at the same concurrency."""
    rows = [r for r in data["summary"] if (r.get("concurrency") or 1) > 1]
    if not rows:
        return _not_run("Not run: no requests were sent at once in this run (buun bench --concurrency 4).")
    cells = [[_e(r["label"]), _e(r["suite"]), _e(r["mode"]), _num(r["concurrency"], "d"), _num(r["decode_tps"], ".1f"),
              _num(r.get("aggregate_tps"), ".1f"), _num(r["mean_al"], ".2f"), _num(r.get("vs_one_slot"), ".2f", "x"),
              _num(r.get("vs_ar"), ".2f", "x"), _num(r.get("served_tps"), ".1f"),
              _num(r.get("served_vs_one_slot"), ".2f", "x"), _num(r["peak_gpu_mib"], "d")] for r in rows]
    head = ["configuration", "suite", "mode", "at once", "per request tok/s", "aggregate tok/s", "mean AL",
            "vs one slot", "vs AR at once", "served tok/s", "served vs one slot", "peak GPU MiB"]
    note = ('<p class="note">N requests sent together to a server of N slots, group after group. Per request: '
            "each request's own decode tok/s; aggregate: the tokens of a group over the time from its first "
            "generated token to its last request's end. The aggregate is set against the same configuration's "
            "tok/s with one request at a time (one slot) and against AR's aggregate at the same concurrency. "
            "Served: the tokens over the time from sending the requests to their end, prefill and first "
            "token included, at once and one at a time.</p>")
    return note + _table("concurrency", head, cells, left=3)


def _kv_table(ident: str, values: dict[str, Any]) -> str:
    rows = [[_e(k), _e(v if isinstance(v, str) else json.dumps(v, default=str))] for k, v in values.items()]
    return _table(ident, ["", ""], rows, left=2)


def _machine(data: dict[str, Any]) -> str:
    m = dict(data["machine"])
    gpus = m.pop("gpus", None) or []
    rows = {**{f"GPU {i}": f"{g.get('name')} ({g.get('memory_mib')} MiB, compute {g.get('compute_cap')})"
               for i, g in enumerate(gpus)}, **m}
    return _kv_table("machine", rows)


def _build(data: dict[str, Any]) -> str:
    info = dict(data["llama_cpp"])
    stamp, upstream = info.pop("build", None), info.pop("upstream_build", None)
    env = data["options"].get("env")
    out = _kv_table("build", {**info, "patch switches set (options.env)": env if env is not None else
                              "not recorded"})
    if stamp:
        out += f'<p>Build stamp (buun-build.json):</p><pre id="build-stamp">{_e(json.dumps(stamp, indent=1))}</pre>'
    else:
        out += '<p class="note" id="build-stamp">No build stamp was recorded with this run.</p>'
    if upstream:  # --against upstream
        out += (f'<p>Upstream build stamp (`buun build --upstream`):</p>'
                f'<pre id="upstream-build-stamp">{_e(json.dumps(upstream, indent=1))}</pre>')
    options = {k: v for k, v in data["options"].items() if k != "env"}
    shown = _e(json.dumps(options, indent=1, default=str))
    return out + f"<details><summary>buun bench options</summary><pre>{shown}</pre></details>"


def _commands(data: dict[str, Any]) -> str:
    if not data["commands"]:
        return _not_run("No server was started: the run measured a running server (--url).")
    labels = {c["name"]: c["label"] for c in data["configs"]}
    return "".join(f"<h3>{_e(labels.get(name, name))}</h3><pre class=argv>{_e(shlex.join(argv))}</pre>"
                   for name, argv in data["commands"].items())


def _prompts(data: dict[str, Any]) -> str:
    sources = data.get("prompt_sources") or {}
    used = list(dict.fromkeys((s["suite"], s["prompt_id"]) for s in data["samples"]))
    if data.get("prompts"):
        texts = {(p["suite"], p["id"]): p["text"] for p in data["prompts"]}
        note = "Recorded with the run."
    else:  # format 1 recorded the ids only: the texts as this buun ships them, where it does
        texts = {}
        for suite, source in sources.items():
            texts.update({(p.suite, p.id): p.text for p in bench.prompts_from_source(suite, source) or []})
        note = ("The run recorded the prompts' ids and sources only; the texts are those its sources hold "
                "on this machine now" + ("." if texts else ", and this machine has none of them."))
    src = "; ".join(f"{s}: {v}" for s, v in sources.items())
    rows = [[_e(suite), _e(pid), f"<pre>{_e(texts[(suite, pid)])}</pre>" if (suite, pid) in texts else "-"]
            for suite, pid in used]
    return f'<p class="note">Sources: {_e(src)}. {_e(note)}</p>' + \
        _table("prompts", ["suite", "id", "text"], rows, left=3)


def render(data: dict[str, Any]) -> str:
    """The whole HTML page of a run (charts need matplotlib: chart.require())."""
    chart.require()
    parts = {
        "speed": _speed(data), "acceptance": _acceptance(data), "al-sweep": _al_sweep(data),
        "memory": _memory(data), "tree": _tree(data),
        "concurrency": _concurrency(data),
        "machine": _machine(data), "build": _build(data), "commands": _commands(data), "prompts": _prompts(data),
    }
    nav = "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t in SECTIONS)
    body = "".join(f'<section id="{i}"><h2>{_e(t)}</h2>{parts[i]}</section>' for i, t in SECTIONS)
    title = f"buun bench - {figures.subtitle(data)}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>buun bench</h1>"
            f'<p class="sub">{_e(figures.subtitle(data))}</p><nav>{nav}</nav>{body}</body></html>\n')


def with_bandwidth(data: dict[str, Any], bandwidth_gbs: float) -> dict[str, Any]:
    """The run with the card's bandwidth given on the command line (said so in the report)."""
    limits = {**(data.get("limits") or {}), "bandwidth_gbs": bandwidth_gbs,
              "bandwidth_source": "--bandwidth-gbs, given when the report was made"}
    limits.setdefault("target_bytes", None)
    limits.setdefault("weights_source", "not recorded by this run's bench format")
    return {**data, "limits": limits}


def write(data: dict[str, Any], path: Path, bandwidth_gbs: float | None = None) -> Path:
    if bandwidth_gbs is not None:
        data = with_bandwidth(data, bandwidth_gbs)
    # --report-from writes beside the JSON it reads: in a folder someone sent, report.html may be a
    # link to one of the reader's files, which must stay as it is
    fsutil.write_atomic(path, render(data).encode("utf-8"))
    return path
