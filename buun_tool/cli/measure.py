"""`buun synth`, `buun bench`: synthetic models and benchmarks (`buun fit`: fit_cmd.py).

    buun synth [RECIPE] [--out DIR] [--scale full|tiny] [--seed N] [--target-type q4_k_m] [--draft-type q4_k]
                                    random-weight GGUFs shaped exactly like the recipe's pair
    buun synth --dry-run            tensor counts and sizes, nothing written
    buun bench [RECIPE] [--synthetic-al 7.67 ... | --al-sweep] [--suite code,math,prose] [--mode raw,chat]
               [--tree-budget 8,16,22,32] [--concurrency 2,4] [--prompts N] [--n-predict N] [--repeats N]
               [--target T.gguf --drafter D.gguf | --recipe-models | --url URL] [--report] [--bandwidth-gbs N]
                                    AR vs DFlash llama-servers: tok/s, TTFT, acceptance; JSON (+ PNG with matplotlib,
                                    + one self-contained HTML report with --report)
    buun bench --against upstream [...]  every configuration on buun's build and on unpatched llama.cpp
                                    (`buun build --upstream`), side by side with buun's tok/s over upstream's
    buun bench --report-from bench.json [--out DIR] [--bandwidth-gbs N]
                                    the HTML report of a recorded run (no server started)
    buun bench --compare A.json B.json [--out DIR] [--json]
                                    two recorded runs side by side; differences beyond their own noise flagged
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from buun_tool.base import console, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import NotReadyError
from buun_tool.cli.bench_options import (
    AgainstOpt,
    AlSweepOpt,
    BandwidthOpt,
    CompareOpt,
    ConcurrencyOpt,
    CtxOpt,
    DrafterOpt,
    DraftMaxOpt,
    HostSamplingOpt,
    LoadTimeoutOpt,
    LongTokensOpt,
    ModeOpt,
    NoArOpt,
    NPredictOpt,
    OutOpt,
    PromptsOpt,
    RecipeModelsOpt,
    RepeatsOpt,
    ReportFromOpt,
    ReportOpt,
    ServerArgsOpt,
    SuiteOpt,
    SyntheticAlOpt,
    TargetOpt,
    TreeBudgetsOpt,
    UntunedOpt,
    UrlOpt,
)
from buun_tool.cli.launch import DraftGpuOpt, GpusOpt, RpcOpt
from buun_tool.cli.options import JsonOpt, ModelsDirOpt, RecipeArg, ScaleOpt, default_scale
from buun_tool.formats import model_plan, recipes
from buun_tool.measure import bench, bench_configs, bench_setup, chart, compare, report, synth
from buun_tool.measure.bench_request import BenchRequest

# --- synth -----------------------------------------------------------------------------------

def synth_cmd(
    recipe: RecipeArg = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the GGUFs (default: <models>/synthetic).",
                                             show_default=False)] = None,
    models_dir: ModelsDirOpt = None,
    scale: Annotated[str, typer.Option("--scale", help="full (~16.5 GB + 1 GB) or tiny (~100 MB).")] = "full",
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same bytes.")] = 0,
    target_type: Annotated[str, typer.Option("--target-type", help=f"One of {', '.join(model_plan.TARGET_TYPES)}.")
                           ] = "q4_k_m",
    draft_type: Annotated[str, typer.Option("--draft-type", help=f"One of {', '.join(model_plan.DRAFT_TYPES)}.")
                          ] = "q4_k",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the tensors and sizes; write nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write random-weight GGUFs with the exact tensors and metadata of the recipe's target and drafter."""
    r = recipes.load(recipe)
    plan = model_plan.plan_pair(r, scale, target_type, draft_type, seed)
    info = {"target": model_plan.summary(plan.target), "drafter": model_plan.summary(plan.drafter)}
    if not dry_run:
        out_dir = out or paths.synthetic_models_dir(paths.models_dir(models_dir))
        t0 = time.monotonic()
        files = synth.write_pair(r, out_dir, scale, seed, target_type, draft_type)
        info["files"] = {"target": str(files[0]), "drafter": str(files[1])}
        info["seconds"] = round(time.monotonic() - t0, 2)
    if json_out:
        console.print_json(info)
        return
    table = Table(header_style="bold", box=None)
    for col in ("model", "arch", "tensors", "parameters", "tensor bytes", "by type"):
        table.add_column(col, justify="left" if col in ("model", "arch", "by type") else "right")
    for role in ("target", "drafter"):
        s = info[role]
        types = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in sorted(s["bytes_by_type"].items()))
        table.add_row(role, s["arch"], str(s["tensors"]), f"{s['params'] / 1e9:.3f} B",
                      f"{s['tensor_bytes'] / 1e9:.2f} GB", types)
    console.out.print(table)
    if "files" in info:
        for role, f in info["files"].items():
            console.ok(f"{role}: {f}")
        console.info(f"{info['seconds']} s (a repeated call with the same inputs returns at once)")


# --- bench -----------------------------------------------------------------------------------

def bench_cmd(
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    recipe_models: RecipeModelsOpt = False,
    scale: ScaleOpt = None,
    models_dir: ModelsDirOpt = None,
    url: UrlOpt = None,
    suite: SuiteOpt = "code,math,prose",
    mode: ModeOpt = "raw,chat",
    prompts: PromptsOpt = 4,
    n_predict: NPredictOpt = 256,
    repeats: RepeatsOpt = 1,
    synthetic_al: SyntheticAlOpt = None,
    al_sweep: AlSweepOpt = False,
    tree_budget: TreeBudgetsOpt = None,
    concurrency: ConcurrencyOpt = None,
    gpus: GpusOpt = None,
    draft_gpu: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    no_ar: NoArOpt = False,
    untuned: UntunedOpt = False,
    against: AgainstOpt = None,
    ctx: CtxOpt = bench_configs.DEFAULT_CTX,
    draft_max: DraftMaxOpt = None,
    host_sampling: HostSamplingOpt = False,
    server_args: ServerArgsOpt = "",
    long_tokens: LongTokensOpt = BenchRequest.long_tokens,
    out: OutOpt = None,
    load_timeout: LoadTimeoutOpt = 300.0,
    report_: ReportOpt = False,
    report_from: ReportFromOpt = None,
    compare_: CompareOpt = None,
    bandwidth_gbs: BandwidthOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run AR and DFlash llama-servers over prompt suites: decode and prompt tok/s, TTFT, acceptance.

    Each server runs the recipe's own flags, as `buun serve` does, with the context pinned (--ctx)
    and the changes given here; bench.json records each server's exact argv."""
    req = BenchRequest(
        recipe=recipe, target=target, drafter=drafter, recipe_models=recipe_models, scale=scale,
        models_dir=models_dir, url=url, suite=suite, mode=mode, prompts=prompts, n_predict=n_predict,
        repeats=repeats, synthetic_al=tuple(synthetic_al or ()), al_sweep=al_sweep, tree_budget=tree_budget,
        concurrency=concurrency, gpus=gpus, draft_gpu=draft_gpu, rpc=rpc, no_ar=no_ar, untuned=untuned,
        against=against.value if against else None, ctx=ctx, draft_max=draft_max, host_sampling=host_sampling,
        server_args=server_args, long_tokens=long_tokens, out=out, load_timeout=load_timeout, report=report_,
        report_from=report_from, compare=compare_, bandwidth_gbs=bandwidth_gbs, json_out=json_out)
    {"run": _run, "report": _report_from, "compare": _compare}[req.job](req)


def _run(req: BenchRequest) -> None:
    """Run the servers, print the tables (or the JSON), write bench.json, its chart and the report."""
    opts = bench_setup.prepare(req, default_scale)
    result = bench.run(opts)
    json_path = bench.write_json(result, opts.out_dir / "bench.json")
    if req.json_out:
        console.print_json(result.to_json())
    else:
        _print_tables(result)
    console.ok(f"results: {json_path}")
    try:
        console.ok(f"chart: {bench.write_chart(result, opts.out_dir / 'bench.png')}")
    except NotReadyError as exc:  # matplotlib is optional: the JSON above is the result
        _no_chart(exc)
        return
    if req.report:
        console.ok(f"report: {report.write(result.to_json(), opts.out_dir / 'report.html')}")


def _print_tables(result: bench.BenchResult) -> None:
    console.out.print(bench.table(result))
    several = bench.concurrency_table(result)
    if several is not None:
        console.out.print(several)
    for line in bench.per_position(result):
        console.info(f"acceptance by position: {line}")
    verdict = bench.tree_verdict(result.to_json())
    if verdict:
        console.ok(verdict)


def _no_chart(exc: NotReadyError) -> None:
    console.warn(f"no chart: {exc.message}; {exc.hint}")  # literal text: the hint's [bench] stays


def _report_from(req: BenchRequest) -> None:
    """--report-from: the HTML report of a recorded run, into --out (default: the run's folder)."""
    assert req.report_from
    data = bench.read_json(req.report_from)
    html_path = report.write(data, (req.out or req.report_from.parent) / "report.html", req.bandwidth_gbs)
    console.ok(f"report: {html_path}")


def _compare(req: BenchRequest) -> None:
    """--compare A B: two recorded runs side by side (or as JSON), and their chart."""
    assert req.compare
    a_path, b_path = req.compare
    a, b = bench.read_json(a_path), bench.read_json(b_path)
    result = compare.compare(a, b, a_path, b_path)
    for w in result.warnings:
        console.warn(w)
    if req.json_out:
        console.print_json(compare.to_json(result))
    else:
        console.out.print(compare.table(result))
        if any(r.flagged is None for r in result.rows):
            console.info("no noise measure: a row with one request in each run (run with --repeats 2 or more)")
    try:
        fig = compare.figure(result, a, b)
    except NotReadyError as exc:
        _no_chart(exc)
        return
    out_dir = req.out or paths.bench_dir() / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    console.ok(f"chart: {chart.save(fig, out_dir / 'compare.png')}")


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import MEASURE

    app.command("synth", rich_help_panel=MEASURE)(synth_cmd)
    app.command("bench", rich_help_panel=MEASURE)(bench_cmd)
