"""`buun tune`: which configuration serves fastest on this card, measured, picked and kept.

    buun tune [RECIPE] [--workload code|prose|chat|long|mixed] [--budget-s 180]
              [--target T.gguf --drafter D.gguf] [--tree-profile calibrated|real|U:H] [--json]
                                    AR, the chain, trees 15 and 22 and a shorter chain on this card;
                                    the fastest that keeps AR's greedy output is served from now on
    buun tune --show                the recipe's tune on this card, and whether it is still fresh
    buun tune --clear               forget the recipe's tunes: serve its own settings again
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buun_tool.app import tune as tune_app
from buun_tool.base import console, paths
from buun_tool.base.console import Table
from buun_tool.base.tree_budget import parse_list
from buun_tool.cli.bench_options import LoadTimeoutOpt, LongTokensOpt, NPredictOpt, OutOpt
from buun_tool.cli.options import MEASURE, JsonOpt, ModelsDirOpt, RecipeArg
from buun_tool.formats import recipes
from buun_tool.measure import bench_long
from buun_tool.measure import tune as measure
from buun_tool.pipeline import build
from buun_tool.server import spec, tuned

WorkloadOpt = Annotated[str, typer.Option(
    "--workload", help="What the prompts are like: code, prose, chat (the chat template, thinking on and off, "
    "greedy and sampled), long (a ~30K-token prompt, as agent clients send) or mixed.")]
BudgetOpt = Annotated[float, typer.Option(
    "--budget-s", min=1, help="Seconds the measurements may take; AR and the recipe's chain always run, the "
    "other configurations while time is left (those cut are named).")]
ProfileOpt = Annotated[str | None, typer.Option(
    "--tree-profile", metavar="calibrated|real|U:H", show_default=False,
    help="Acceptance on random-weight models (buun synth): the calibrated tree profile (default there), "
    "the drafter's own (real: the default on real models), or U:HARD_TOP1.")]
TargetOpt = Annotated[Path | None, typer.Option(
    "--target", help="Target GGUF (default: the recipe's, as `buun setup` made it).", show_default=False)]
DrafterOpt = Annotated[Path | None, typer.Option(
    "--drafter", help="DFlash drafter GGUF (default: the recipe's).", show_default=False)]
TreesOpt = Annotated[str, typer.Option("--tree-budget", metavar="N,N", help="The tree budgets to try.")]


def tune_cmd(
    recipe: RecipeArg = None,
    workload: WorkloadOpt = "code",
    budget_s: BudgetOpt = measure.DEFAULT_BUDGET_S,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    models_dir: ModelsDirOpt = None,
    tree_profile: ProfileOpt = None,
    tree_budget: TreesOpt = ",".join(map(str, measure.TREE_BUDGETS)),
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Prompts per suite.")] = 2,
    n_predict: NPredictOpt = 128,
    long_tokens: LongTokensOpt = str(bench_long.SIZES[-1]),
    out: OutOpt = None,
    load_timeout: LoadTimeoutOpt = 300.0,
    show: Annotated[bool, typer.Option("--show", help="Show the recipe's tune on this card; measure nothing.")]
    = False,
    clear: Annotated[bool, typer.Option("--clear", help="Forget the recipe's tunes (every card's).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Measure AR, the chain and DDTrees on this card and serve the fastest from now on.

    The pick is applied by serve, start, service install and bench between the recipe and the
    command line (which wins); `buun status` and `--print-cmd` say where it came from."""
    r = recipes.load(recipe)
    if clear:
        gone = tuned.clear(r.name)
        console.ok(f"forgot {len(gone)} tune(s) of {r.name}" if gone else f"{r.name} has no tune to forget")
        return
    folder = paths.models_dir(models_dir)
    if show:
        _show(r, folder, target, drafter)
        return
    opts = tune_app.prepare(r, folder, target, drafter, tree_profile, out, workload=workload, budget_s=budget_s,
                            tree_budgets=tuple(parse_list(tree_budget, "--tree-budget")), prompts=prompts,
                            n_predict=n_predict, long_sizes=tuple(bench_long.parse_sizes(long_tokens)),
                            load_timeout=load_timeout)
    tune_app.check_card_free(r)
    outcome = tune_app.tune(opts)
    if json_out:
        console.print_json({**tune_app.to_json(outcome.result, opts), "tuned": outcome.tuned.to_json(),
                            "files": {k: str(v) for k, v in outcome.files.items()}})
    else:
        print_result(outcome)


def _show(r: recipes.Recipe, folder: Path, target: Path | None, drafter: Path | None) -> None:
    if target is None or drafter is None:
        target, drafter = spec.default_paths(r, folder)
    binary = build.find_binary("llama-server")
    found = tuned.find(r.name, None, build.variant_of(binary) == "cpu", binary, target, drafter)
    console.out.print(found.status(), markup=False)
    if found.tuned:
        console.info(f"evidence: {found.tuned.evidence}")


def print_result(outcome: tune_app.Outcome) -> None:
    res = outcome.result
    table = Table(header_style="bold", box=None)
    for col in ("configuration", "decode tok/s", "x AR", "AL", "prefill tok/s", "TTFT ms", "greedy check", "s"):
        table.add_column(col, justify="left" if col in ("configuration", "greedy check") else "right")
    ar = next((m.decode_tps for m in res.measured if m.choice.kind == "ar"), None)
    for m in res.measured:
        mark = " <" if m is res.picked else ""
        check = "-" if m.greedy is None else ("equal" if m.greedy.ok else "DIFFERS")
        if m.greedy and m.greedy.ok and m.greedy.ties:
            check += f" ({m.greedy.ties} near-tie)"
        table.add_row(m.choice.describe() + mark, _f(m.decode_tps), _f(m.decode_tps / ar if ar and m.decode_tps
                      else None, 2), _f(m.mean_al, 2), _f(m.prompt_tps), _f(m.ttft_ms, 0), check, _f(m.seconds, 0))
    console.out.print(table)
    for m in res.measured:
        if m.greedy and not m.greedy.ok:
            console.warn(f"{m.choice.describe()}: output differs from AR's ({m.greedy.detail}): not eligible")
    for line in res.skipped:
        console.info(f"not measured: {line}")
    if res.cut:
        console.warn(f"the time budget ran short: {', '.join(res.cut)} not measured (--budget-s more measures them)")
    _print_forms(res)
    console.info(f"evidence: {outcome.files['tune'].parent}")
    console.ok(f"picked {outcome.tuned.choice.describe()}: {res.why}; measured in {res.seconds:.0f} s. `buun serve`, "
               "`start` and `service install` use it from now on")


def _print_forms(res: measure.TuneResult) -> None:
    if not res.forms:
        return
    table = Table(header_style="bold", box=None, title="the pick by form of request")
    for col in ("suite", "form", "tok/s", "AR tok/s", "x AR", "AL", "accepted"):
        table.add_column(col, justify="left" if col in ("suite", "form") else "right")
    for f in res.forms:
        rate = f"{f['accept_rate']:.0%}" if f["accept_rate"] is not None else "-"
        table.add_row(f["suite"], f["form"], _f(f["decode_tps"]), _f(f["ar_tps"]), _f(f["speedup"], 2),
                      _f(f["mean_al"], 2), rate)
    console.out.print(table)


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def register(app: typer.Typer) -> None:
    app.command("tune", rich_help_panel=MEASURE)(tune_cmd)
