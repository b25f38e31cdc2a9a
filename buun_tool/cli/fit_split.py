"""`buun fit --gpu-mem 24,24` and `buun fit --gpus 0,1`: the layer split over several cards of one
host (split.py), as `buun serve --gpus` plans it, and with --measure what the cards hold.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from buun_tool.base import console, nvidia, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import UsageError
from buun_tool.formats import recipes
from buun_tool.measure import fit_measure
from buun_tool.plan import devices, fit, split

# the columns of the per-card table: (title, component keys)
_COLUMNS = (("weights", ("target_weights",)), ("KV", ("target_kv",)), ("state", ("recurrent",)),
            ("drafter", ("drafter_weights", "drafter_kv", "drafter_compute", "features")),
            ("buffers", ("target_compute", "cuda_overhead")))


def cards(gpu_mem: str | None, gpus: str | None, draft_gpu: int | None, recipe_gpus: tuple[int, ...] = ()
          ) -> tuple[list[split.Card], int | None, bool]:
    """The cards `buun fit` plans for, the drafter's position among them, and whether they are
    this host's (what --measure can load on): --gpu-mem's sizes (cards numbered in order),
    --gpus's cards as nvidia-smi describes them (with --gpu-mem, those sizes instead), else the
    recipe's server.gpus (24 GiB each where nvidia-smi does not list them), else the first card
    here, else 24 GiB."""
    sizes = _sizes(gpu_mem) if gpu_mem else None
    found = {g.index: g for g in nvidia.detect_gpus()}
    if gpus or (recipe_gpus and sizes is None):
        chosen = devices.parse_gpus(gpus) if gpus else recipe_gpus
        missing = [i for i in chosen if i not in found]
        if sizes is None and gpus and missing:
            raise UsageError(f"--gpus {gpus}: nvidia-smi lists no card {', '.join(map(str, missing))}"
                             + (f" (cards here: {', '.join(map(str, found))})" if found else " (no nvidia-smi)"),
                             "pass the indices `nvidia-smi -L` shows, or the sizes: --gpu-mem 24,24")
        if sizes is None:
            sizes = [found[i].memory_mib / 1024 if i in found else devices.UNKNOWN_GIB for i in chosen]
        elif len(sizes) != len(chosen):
            raise UsageError(f"--gpu-mem {gpu_mem}: {len(sizes)} sizes for the {len(chosen)} cards of --gpus {gpus}",
                             "give one size per card, or leave out --gpu-mem to read them from nvidia-smi")
        out = [split.Card(g, i, found[i].name if i in found else "") for g, i in zip(sizes, chosen, strict=True)]
        real = not missing
    else:
        if sizes is None and not found:  # the plan is for a card of a size nobody gave: say which
            console.info(f"no GPU here (nvidia-smi lists none): planned for a {devices.UNKNOWN_GIB:g} GiB card; "
                         "--gpu-mem GIB plans for another")
        if sizes is None:
            sizes = [found[min(found)].memory_mib / 1024 if found else devices.UNKNOWN_GIB]
        out, real = split.cards_from_gib(sizes), False
    if draft_gpu is None:
        return out, None, real
    indices = [c.index for c in out]
    if draft_gpu not in indices:
        raise UsageError(f"--draft-gpu {draft_gpu}: not one of the cards planned for ({', '.join(map(str, indices))})",
                         "pass one of them (with --gpu-mem, cards are numbered 0, 1, ... in order)")
    return out, indices.index(draft_gpu), real


def _sizes(value: str) -> list[float]:
    try:
        sizes = [float(v) for v in value.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(not math.isfinite(s) or s <= 0 for s in sizes):  # nan and inf parse as floats
        raise UsageError(f"--gpu-mem {value}: expected GiB per card, such as 24 or 24,24")
    return sizes


def report(r: recipes.Recipe, flags: fit.FitFlags, cs: list[split.Card], draft: int | None, margin: float,
           weights: fit.Weights) -> dict[str, Any]:
    """The split at these flags, and at the largest context; whether it fits."""
    best = split.max_context(r, flags, cs, draft, weights, margin)
    at = split.plan(r, flags, cs, draft, weights, margin)
    largest = split.plan(r, replace(flags, ctx=best), cs, draft, weights, margin) if best else None
    return {"cards_gib": [c.gib for c in cs], "margin_gib": margin, "fits": at.fits, "max_ctx": best,
            "weights": weights.source, "split": at, "split_at_max_ctx": largest}


def run(r: recipes.Recipe, flags: fit.FitFlags, cs: list[split.Card], draft: int | None, margin: float,
        weights: fit.Weights, measure: bool, scale: str, models: Path, on_cards: bool, json_out: bool) -> None:
    """`buun fit` for several cards: the plan, and with `measure` (on the cards of --gpus) what
    llama-server allocates on each."""
    if measure and not on_cards:
        raise UsageError("--measure loads the split on real cards", "name them with --gpus 0,1")
    rep = report(r, flags, cs, draft, margin, weights)
    measured = _measure(r, flags, cs, draft, margin, scale, models) if measure else None
    if json_out:
        out = {**rep, "split": rep["split"].to_json(),
               "split_at_max_ctx": rep["split_at_max_ctx"].to_json() if rep["split_at_max_ctx"] else None,
               "measured": measured[0].to_json() if measured else None,
               "measured_against": measured[1].to_json() if measured else None}
        console.print_json(out)
        return
    console.out.print(table(rep["split"]))
    console.info(f"weights from {rep['weights']}")
    verdict = "[green]fits[/]" if rep["fits"] else "[red]does not fit[/]"
    sizes = " + ".join(f"{g:.1f}" for g in rep["cards_gib"])
    console.out.print(f"{verdict} on {sizes} GiB split by layers (keeping {margin:.2f} GiB free on each); largest "
                      f"context: [bold]{rep['max_ctx']}[/] tokens")
    big = rep["split_at_max_ctx"]
    if big:
        if big.flags.ctx != flags.ctx:
            console.out.print(table(big))
        passes = " ".join(f"{n} {v}" for n, v in devices.split_flags(big))
        console.out.print(f"at -c {rep['max_ctx']}: {big.describe()}; `buun serve --gpus` passes [bold]{passes}[/]")
    if measured:
        console.out.print(measured_table(measured[1], measured[0]))
        console.info(f"measured with: {shlex.join(measured[0].command)}\n  log: {measured[0].log_path}")


def table(s: split.Split) -> Table:
    t = Table(header_style="bold", box=None, title=f"{s.flags.describe()}, -ts {s.ts}")
    for col in ("card", "device", "layers", *(c for c, _ in _COLUMNS), "total GiB", "of GiB", "free"):
        t.add_column(col, justify="left" if col in ("card", "device", "layers") else "right")
    for c in s.cards:
        parts = [sum(c.components.get(k, 0) for k in keys) for _, keys in _COLUMNS]
        t.add_row(c.card.label(), c.device, c.layers(), *(f"{b / fit.GIB:.2f}" if b else "-" for b in parts),
                  f"{c.total / fit.GIB:.2f}", f"{c.card.gib:.1f}", f"{c.free / fit.GIB:.2f}",
                  style=None if c.free >= s.margin_gib * fit.GIB else "red")
    return t


def measured_table(s: split.Split, m: fit_measure.Measurement) -> Table:
    t = Table(header_style="bold", box=None, title="measured: llama.cpp's buffers and nvidia-smi, per card")
    for col in ("card", "device", "predicted GiB", "buffers GiB", "nvidia-smi GiB"):
        t.add_column(col, justify="left" if col in ("card", "device") else "right")
    for c in s.cards:
        buffers = m.per_device_mib.get(c.device)
        smi = (m.gpu_used_by_card or {}).get(c.card.index)
        t.add_row(c.card.label(), c.device, f"{c.total / fit.GIB:.2f}",
                  "-" if buffers is None else f"{buffers / 1024:.2f}", "-" if smi is None else f"{smi / 1024:.2f}")
    return t


def _measure(r: recipes.Recipe, flags: fit.FitFlags, cs: list[split.Card], draft: int | None, margin: float,
             scale: str, models: Path) -> tuple[fit_measure.Measurement, split.Split]:
    """Load the synthetic pair split over the cards as `buun serve --gpus` would: its env and
    -sm/-ts/-dev/-devd from the plan for the synthetic weights; the plan, for what was loaded."""
    weights = fit.weights_from_plan(r, scale, "q4_k_m", "q4_k")
    plan = split.plan(r, flags, cs, draft, weights, margin, scale)
    where = devices.Placement(tuple(c.index for c in cs), cs[plan.draft.position].index, ())
    m = fit_measure.measure(r, flags, paths.synthetic_models_dir(models), paths.state_dir() / "fit", scale=scale,
                    extra=devices.split_flags(plan), env=where.env)
    return m, split.plan(r, m.flags, cs, draft, weights, margin, scale)
