"""`buun fit`: the GPU memory planner's command (the planner is fit.py; several cards, fit_split.py).

    buun fit [RECIPE] [--gpu-mem 24] [--ctx N] [--ctk q8_0] [--draft-max N] [--tree-budget N] [--measure]
             [--slots N] [--ctx-per-slot N]
                                    GPU memory by component, the largest context that fits, knobs;
                                    with a tree budget, what the tree adds over the chain; the largest
                                    context per slot for 1 to 8 slots, what one more slot costs, and
                                    how many slots of --ctx-per-slot tokens fit
    buun fit --gpu-mem 24,24 | --gpus 0,1 [--draft-gpu N] [--measure]
                                    a layer split over several cards: each card's layers and memory,
                                    the -ts buun serve passes, the largest context
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from buun_tool.base import console, nvidia, paths
from buun_tool.base import tree_budget as budgets
from buun_tool.base.console import Table
from buun_tool.base.errors import UsageError
from buun_tool.cli import fit_split
from buun_tool.cli.options import JsonOpt, ModelsDirOpt, RecipeArg, ScaleOpt, default_scale
from buun_tool.formats import recipes
from buun_tool.measure import fit_measure
from buun_tool.pipeline import patches
from buun_tool.plan import devices, fit

# --rollback's values; typer refuses any other by name (the environment's is checked by patches)
Rollback = Enum("Rollback", {name: name for name in patches.ROLLBACKS}, type=str)

# the command's options, one alias each (the command's signature stays a list of names)
GpuMemOpt = Annotated[str | None, typer.Option("--gpu-mem", metavar="GIB[,GIB...]", help="GPU memory in GiB "
                                               "(nvidia-smi MiB / 1024), one number per card: 24,24 plans a layer "
                                               "split over two (default: the cards of --gpus or the recipe's "
                                               "server.gpus, else the GPU here, else 24).",
                                               show_default=False)]
GpusOpt = Annotated[str | None, typer.Option("--gpus", metavar="0,1", help="The cards of a layer split, by "
                                             "nvidia-smi index: their memory from nvidia-smi (as `buun serve "
                                             "--gpus` plans it); --measure loads the split on them.",
                                             show_default=False)]
DraftGpuOpt = Annotated[int | None, typer.Option("--draft-gpu", metavar="N", help="The drafter's card, one of "
                                                 "--gpus (or a position in --gpu-mem); default: the last.",
                                                 show_default=False)]
CtxOpt = Annotated[int | None, typer.Option("--ctx", min=1, help="-c (default: the recipe's).", show_default=False)]
CtkOpt = Annotated[str | None, typer.Option("--ctk", help="KV cache type: f16, q8_0, q4_0, ...", show_default=False)]
CtvOpt = Annotated[str | None, typer.Option("--ctv", help="V cache type (default: as --ctk).", show_default=False)]
DraftMaxOpt = Annotated[int | None, typer.Option(
    "--draft-max", min=0, help="Draft tokens per step (llama-server's --draft-max); 0 = AR only.",
    show_default=False)]
CtxDraftOpt = Annotated[int | None, typer.Option("--ctx-draft", min=0, help="The drafter's context (-cd); 0 = as -c.",
                                                 show_default=False)]
UbatchOpt = Annotated[int | None, typer.Option("--ubatch", min=1, help="-ub (default: the recipe's).",
                                               show_default=False)]
BatchOpt = Annotated[int | None, typer.Option("--batch", min=1, help="-b (default: the recipe's).", show_default=False)]
SlotsOpt = Annotated[int | None, typer.Option("--slots", "--parallel", min=1, help="Slots (-np): requests served at "
                                              "once, each with -c / N of the context (default: the recipe's).",
                                              show_default=False)]
CtxPerSlotOpt = Annotated[int | None, typer.Option("--ctx-per-slot", min=1, help="Context of each slot: -c is this "
                                                   "times the slots; also says how many such slots fit.",
                                                   show_default=False)]
TreeBudgetOpt = Annotated[int | None, typer.Option("--tree-budget", help="Draft nodes of the DDTree verified per "
                                                   "step (--spec-tree-budget); 0 = the chain (default: the "
                                                   "recipe's).", show_default=False)]
RollbackOpt = Annotated[Rollback | None, typer.Option("--rollback",
                                                      help="Recurrent-state rollback: tape (buun's patch 0011) or "
                                                      "snapshot (upstream's planes); default: "
                                                      "LLAMA_RS_ROLLBACK, else tape.", show_default=False)]
MarginOpt = Annotated[float, typer.Option("--margin", help="GiB kept free (display, fragmentation).")]
MeasureOpt = Annotated[bool, typer.Option("--measure", help="Also load the synthetic pair in the real "
                                          "llama-server and read what it allocates.")]


def _gib(n: float) -> str:
    return f"{n / fit.GIB:.2f}"


def _fit_table(pred: fit.Prediction, measured: fit_measure.Measurement | None) -> Table:
    """Predicted (and measured) memory by component, in GiB, or MiB for the tiny models."""
    unit, div = ("GiB", fit.GIB) if pred.total > 2 * fit.GIB else ("MiB", fit.MIB)
    table = Table(header_style="bold", box=None, title=pred.flags.describe())
    table.add_column("component")
    table.add_column(f"predicted {unit}", justify="right")
    if measured:
        table.add_column(f"measured {unit}", justify="right")
    table.add_column("detail")
    for c in pred.components:
        row = [c.label, f"{c.bytes / div:.2f}"]
        if measured:
            mib = measured.components.get(c.key)
            row.append("-" if mib is None else f"{mib * fit.MIB / div:.2f}")
        table.add_row(*row, c.detail)
    total, note = [f"{pred.total / div:.2f}"], ""
    if measured and measured.gpu_used_mib is not None:
        total.append(f"{measured.gpu_used_mib * fit.MIB / div:.2f}")
        note = "measured: nvidia-smi after load"
    elif measured:
        total.append(f"{sum(measured.components.values()) * fit.MIB / div:.2f}")
        note = "measured: sum of llama.cpp's buffers"
    table.add_row("total", *total, note, style="bold")
    return table


def fit_cmd(
    recipe: RecipeArg = None, gpu_mem: GpuMemOpt = None, gpus: GpusOpt = None, draft_gpu: DraftGpuOpt = None,
    ctx: CtxOpt = None, ctk: CtkOpt = None, ctv: CtvOpt = None, draft_max: DraftMaxOpt = None,
    ctx_draft: CtxDraftOpt = None, ubatch: UbatchOpt = None, batch: BatchOpt = None, slots: SlotsOpt = None,
    ctx_per_slot: CtxPerSlotOpt = None, tree_budget: TreeBudgetOpt = None, rollback: RollbackOpt = None,
    margin: MarginOpt = fit.MARGIN_GIB, measure_: MeasureOpt = False, scale: ScaleOpt = None,
    models_dir: ModelsDirOpt = None, json_out: JsonOpt = False,
) -> None:
    """Predict GPU memory by component; say whether it fits, the largest context, and what makes it fit.

    The weights are those of the recipe's GGUFs in the models folder once pulled and converted,
    else the exact tensor list of its geometry; --measure loads the synthetic pair from there."""
    rollback_name = rollback.value if rollback else patches.rollback_from_env()
    _check_margin(margin)
    if scale is not None:
        default_scale(scale)  # only --measure reads it: a misspelt one was ignored without a word
    r = recipes.load(recipe)
    models = paths.models_dir(models_dir)
    flags = _flags(r, ctx=ctx, ctk=ctk, ctv=ctv, draft_max=draft_max, ctx_draft=ctx_draft, ubatch=ubatch,
                   batch=batch, slots=slots, ctx_per_slot=ctx_per_slot, tree_budget=tree_budget,
                   rollback=rollback_name)
    cards, draft, on_cards = fit_split.cards(gpu_mem, gpus, draft_gpu, r.gpus)
    weights = fit.default_weights(r, models)
    if len(cards) > 1:
        return fit_split.run(r, flags, cards, draft, margin, weights, measure_, default_scale(scale), models,
                             on_cards, json_out)
    pred = fit.predict(r, flags, weights=weights)
    report = _report(r, flags, pred, cards[0].gib, margin, weights, ctx_per_slot)
    single = devices.Placement((cards[0].index,), cards[0].index, ()) if on_cards else None
    measured, compared = _measure(r, flags, scale, models, single) if measure_ else (None, None)
    if json_out:
        console.print_json(_json_report(report, measured, compared))
        return
    _print_fit(pred, report)
    if measured and compared:
        console.out.print(_fit_table(compared, measured))
        console.info(f"measured with: {shlex.join(measured.command)}\n  log: {measured.log_path}")


def _check_margin(margin: float) -> None:
    if not math.isfinite(margin) or margin < 0:  # nan fitted nothing; a negative margin planned past the card
        raise UsageError(f"--margin {margin:g}: expected GiB of 0 or more to keep free",
                         f"for example --margin {fit.MARGIN_GIB:g} (the default)")


def _flags(r: recipes.Recipe, *, ctx: int | None, ctk: str | None, ctv: str | None, draft_max: int | None,
           ctx_draft: int | None, ubatch: int | None, batch: int | None, slots: int | None,
           ctx_per_slot: int | None, tree_budget: int | None, rollback: str) -> fit.FitFlags:
    """The recipe's flags with the command's options over them, for the slots asked for, checked."""
    base = fit.flags_from_recipe(r)
    kv = ctk or base.cache_type_k
    if ctx and ctx_per_slot:
        raise UsageError("--ctx and --ctx-per-slot both set the context", "give one of them: -c is the slots' total")
    flags = replace(base, ctx=ctx or base.ctx, cache_type_k=kv, cache_type_v=ctv or (kv if ctk else base.cache_type_v),
                    draft_max=base.draft_max if draft_max is None else draft_max,
                    draft_ctx=base.draft_ctx if ctx_draft is None else (ctx_draft or None),
                    ubatch=ubatch or base.ubatch, batch=batch or base.batch,
                    rollback=rollback, tree_budget=base.tree_budget if tree_budget is None else
                    budgets.check(tree_budget, "--tree-budget"))
    n_slots = slots or base.n_parallel
    # the ubatch grows with the slots as `buun serve --slots` makes it, unless given here
    flags = fit.with_slots(r, flags, n_slots) if not ubatch else replace(flags, n_parallel=n_slots)
    if ctx_per_slot:
        flags = replace(flags, ctx=ctx_per_slot * n_slots)
    fit.check_tree(flags)
    return flags


def _report(r: recipes.Recipe, flags: fit.FitFlags, pred: fit.Prediction, gpu_gib: float, margin: float,
            weights: fit.Weights, ctx_per_slot: int | None) -> dict[str, Any]:
    """One card's plan: whether it fits, the largest context, the knobs, the tree's cost, the slots."""
    return {"gpu_gib": gpu_gib, "margin_gib": margin, "fits": fit.fits(pred, gpu_gib, margin),
            "max_ctx": fit.max_context(r, flags, gpu_gib, margin, weights=weights),
            "prediction": pred.to_json(), "weights": weights.source,
            "knobs": fit.knobs(r, flags, gpu_gib, margin, weights=weights),
            "tree_extra": _tree_extra(r, flags, weights),
            "slots": _slots_report(r, flags, gpu_gib, margin, weights, ctx_per_slot)}


def _json_report(report: dict[str, Any], measured: fit_measure.Measurement | None,
                 compared: fit.Prediction | None) -> dict[str, Any]:
    """`buun fit --json`: the report with its knobs and slot plans as plain values, and what was measured."""
    report["knobs"] = [{"change": k.change, "total_gib": k.total_bytes / fit.GIB, "max_ctx": k.max_ctx}
                       for k in report["knobs"]]
    report["slots"]["plans"] = [{**asdict(p), "ctx": p.ctx} for p in report["slots"]["plans"]]
    report["measured"] = measured.to_json() if measured else None
    report["measured_against"] = compared.to_json() if compared else None
    return report


def _tree_extra(r: recipes.Recipe, flags: fit.FitFlags, weights: fit.Weights) -> dict[str, Any] | None:
    """What the tree adds over the chain (bytes by component), or None for the chain."""
    if not flags.tree:
        return None
    extra = fit.tree_extra(r, flags, weights=weights)
    return {"budget": flags.tree_budget, "bytes": sum(extra.values()), "by_component": extra}


def _slots_report(r: recipes.Recipe, flags: fit.FitFlags, gpu_gib: float, margin: float, weights: fit.Weights,
                  ctx_per_slot: int | None) -> dict[str, Any]:
    """The slots' part of `buun fit`: for 1 to MAX_SLOTS slots the largest context each can have,
    what one more slot than these flags' costs (at their context per slot), and, given a context
    per slot, how many such slots fit."""
    each = fit.cells(flags.ctx, flags.n_parallel) // flags.n_parallel
    out: dict[str, Any] = {
        "slots": flags.n_parallel, "ctx_per_slot": each,
        "plans": fit.slot_plans(r, flags, gpu_gib, margin, weights=weights), "one_more": None,
        "fit_at": None,
    }
    if flags.n_parallel < recipes.MAX_SLOTS and not flags.tree:
        out["one_more"] = fit.slot_cost(r, flags, each, weights=weights)
        # what any server needs for a slot, DFlash or not: its KV cells and its recurrent state
        out["own_cache"] = out["one_more"].get("target_kv", 0) + fit.recurrent_plane(r.geometry_at("full").target)
    if ctx_per_slot:
        out["fit_at"] = {"ctx_per_slot": ctx_per_slot,
                         "slots": fit.max_slots(r, flags, gpu_gib, margin, ctx_per_slot, weights=weights)}
    return out


def _measure(r: recipes.Recipe, flags: fit.FitFlags, scale: str | None, models: Path,
             where: devices.Placement | None = None) -> tuple[fit_measure.Measurement, fit.Prediction]:
    """The real llama-server's buffers, and the prediction for exactly what was loaded (on the
    one card `where` names, if it names one)."""
    s = default_scale(scale)
    measured = fit_measure.measure(r, flags, paths.synthetic_models_dir(models), paths.state_dir() / "fit", scale=s,
                           env=where.env if where else None)
    weights = fit.weights_from_plan(r, s, "q4_k_m", "q4_k")
    return measured, fit.predict(r, measured.flags, scale=s, weights=weights, cuda=bool(nvidia.detect_gpus()))


def _print_fit(pred: fit.Prediction, report: dict) -> None:
    console.out.print(_fit_table(pred, None))
    console.info(f"weights from {report['weights']}")
    verdict = "[green]fits[/]" if report["fits"] else "[red]does not fit[/]"
    console.out.print(f"{verdict} in {report['gpu_gib']:.1f} GiB (keeping {report['margin_gib']:.2f} GiB free); "
                      f"largest context with these settings: [bold]{report['max_ctx']}[/] tokens")
    table = Table(header_style="bold", box=None, title="knobs")
    for col in ("change", "GiB at this -c", "largest -c"):
        table.add_column(col, justify="left" if col == "change" else "right")
    for k in report["knobs"]:
        table.add_row(k.change, _gib(k.total_bytes), str(k.max_ctx))
    console.out.print(table)
    _print_slots(pred, report["slots"])
    extra = report["tree_extra"]
    if extra:
        labels = {c.key: c.label for c in pred.components}
        parts = ", ".join(f"{labels[k]} +{v / fit.MIB:.2f}" for k, v in extra["by_component"].items())
        console.out.print(f"tree budget {extra['budget']}: [bold]+{extra['bytes'] / fit.MIB:.2f} MiB[/] over the "
                          f"chain ({parts} MiB)")


def _print_slots(pred: fit.Prediction, slots: dict[str, Any]) -> None:
    table = Table(header_style="bold", box=None, title="slots (-np): the largest context each can have")
    for col in ("slots", "context per slot", "-c", "-ub"):
        table.add_column(col, justify="right")
    for p in slots["plans"]:
        style = "bold" if p.slots == slots["slots"] else None
        table.add_row(str(p.slots), str(p.ctx_per_slot), str(p.ctx), str(p.ubatch), style=style)
    console.out.print(table)
    more = slots["one_more"]
    if more:
        labels = {c.key: c.label for c in pred.components}
        own = slots["own_cache"]
        rest = {k: v for k, v in more.items() if k != "target_kv"}
        rest["recurrent"] = rest.get("recurrent", 0) - (own - more.get("target_kv", 0))
        labels["recurrent"] = "rollback tape" if pred.flags.rollback == "tape" else "rollback snapshot planes"
        parts = ", ".join(f"{labels.get(k, k)} +{v / fit.MIB:.1f}" for k, v in rest.items() if v)
        console.out.print(f"one more slot ({slots['slots'] + 1}) at {slots['ctx_per_slot']} tokens each: "
                          f"[bold]+{sum(more.values()) / fit.MIB:.1f} MiB[/]: its cache +{own / fit.MIB:.1f} "
                          f"(KV cells and recurrent state), and +{sum(rest.values()) / fit.MIB:.1f} MiB ({parts})")
    at = slots["fit_at"]
    if at:
        verdict = (f"[bold]{at['slots']}[/] slot(s) of {at['ctx_per_slot']} tokens fit" if at["slots"]
                   else f"[red]not even one slot of {at['ctx_per_slot']} tokens fits[/]")
        console.out.print(verdict)


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import MEASURE

    app.command("fit", rich_help_panel=MEASURE)(fit_cmd)
