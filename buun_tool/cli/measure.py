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

import shlex
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from buun_tool.base import command, console, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import NotReadyError, UsageError
from buun_tool.cli.launch import DraftGpuOpt, GpusOpt, RpcOpt
from buun_tool.cli.options import JsonOpt, ModelsDirOpt, RecipeArg, ScaleOpt, default_scale
from buun_tool.formats import gguf_tools, model_plan, recipes
from buun_tool.measure import bench, bench_configs, chart, compare, report, synth
from buun_tool.pipeline import build
from buun_tool.plan import devices
from buun_tool.server import addresses, spec

Against = Enum("Against", {"upstream": "upstream"}, type=str)  # bench --against: the builds beside buun's


def _csv(value: str, valid: tuple[str, ...], option: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in items if v not in valid]
    if bad or not items:
        raise UsageError(f"{option} {value!r}: expected a comma-separated list of {', '.join(valid)}")
    return items


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

def _bench_models(r: recipes.Recipe, target: Path | None, drafter: Path | None, scale: str | None,
                  models: Path) -> tuple[Path, Path | None, str]:
    if target:
        return target, drafter, f"models: {target.name}" + (f" + {drafter.name}" if drafter else "")
    s = default_scale(scale)
    t, d = synth.write_pair(r, paths.synthetic_models_dir(models), scale=s)
    return t, d, f"synthetic {s} models (random weights)"


def bench_cmd(
    recipe: RecipeArg = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target GGUF (default: the synthetic pair).",
                                                show_default=False)] = None,
    drafter: Annotated[Path | None, typer.Option("--drafter", help="DFlash drafter GGUF.", show_default=False)
                       ] = None,
    recipe_models: Annotated[bool, typer.Option(
        "--recipe-models", help="Bench the recipe's own models, the pair `buun setup` pulled and converted into "
        "--models-dir (what `buun serve` serves), on their real acceptance.")] = False,
    scale: ScaleOpt = None,
    models_dir: ModelsDirOpt = None,
    url: Annotated[str | None, typer.Option("--url", help="Benchmark this running llama-server instead.",
                                            show_default=False)] = None,
    suite: Annotated[str, typer.Option("--suite", help="Comma-separated: code, math, prose.")] = "code,math,prose",
    mode: Annotated[str, typer.Option("--mode", help="raw (/completion), chat (/v1/chat/completions) or both."
                                      )] = "raw,chat",
    prompts: Annotated[int, typer.Option("--prompts", min=0, help="Prompts per suite (0: all).")] = 4,
    n_predict: Annotated[int, typer.Option("--n-predict", min=1, help="Tokens generated per request.")] = 256,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Requests per prompt.")] = 1,
    synthetic_al: Annotated[list[float] | None, typer.Option(
        "--synthetic-al", help="Force a mean acceptance length with --spec-synth-len (repeatable: one DFlash "
        "server each). Measures step cost on random weights.", show_default=False)] = None,
    al_sweep: Annotated[bool, typer.Option("--al-sweep", help="Add DFlash servers at synthetic AL 1, 2, ..., 10: "
                                           "the report's tok/s against AL.")] = False,
    tree_budget: Annotated[str | None, typer.Option(
        "--tree-budget", metavar="N,N,...", help="Sweep the DDTree budget: one DFlash server per budget and the "
        "chain (0), on buun synth's random weights with the calibrated synthetic tree profile (--spec-synth-tree), "
        "on real models with the drafter's own acceptance (needs patch 0022): the fastest budget, and the "
        "report's tok/s and AL against the budget.", show_default=False)] = None,
    concurrency: Annotated[str | None, typer.Option(
        "--concurrency", metavar="N,N,...", help="Also send N requests at once to each AR and chain DFlash "
        "configuration on a server of N slots: per-request and aggregate tok/s, against one slot and against "
        "AR at N.", show_default=False)] = None,
    gpus: GpusOpt = None,
    draft_gpu: DraftGpuOpt = None,
    rpc: RpcOpt = None,
    no_ar: Annotated[bool, typer.Option("--no-ar", help="Skip the autoregressive baseline.")] = False,
    against: Annotated[Against | None, typer.Option(
        "--against", help="Also run every configuration on unpatched llama.cpp (`buun build --upstream` builds "
        "it), in its spellings and without -cd: both rows, and buun's tok/s over upstream's.",
        show_default=False)] = None,
    ctx: Annotated[int, typer.Option("--ctx", min=1, help="llama-server -c of every server (bench pins it; the "
                                     "recipe's `fit` depends on the card).")] = bench_configs.DEFAULT_CTX,
    draft_max: Annotated[int | None, typer.Option("--draft-max", min=0, help="Replaces the recipe's --draft-max.",
                                                  show_default=False)] = None,
    host_sampling: Annotated[bool, typer.Option("--host-sampling", help="Sample on the host: drops the recipe's "
                                                "--backend-sampling.")] = False,
    server_args: Annotated[str, typer.Option("--server-args", help="llama-server flags for every server, as one "
                                             "string, replacing the recipe's of the same option as `buun serve -- "
                                             "FLAGS` does: --server-args '-t 8'.")] = "",
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the JSON, PNG and server logs.",
                                             show_default=False)] = None,
    load_timeout: Annotated[float, typer.Option("--load-timeout", help="Seconds a server may take to load.")
                            ] = 300.0,
    report_: Annotated[bool, typer.Option("--report", help="Also write report.html: one self-contained HTML file "
                                          "with every chart and table (needs matplotlib).")] = False,
    report_from: Annotated[Path | None, typer.Option("--report-from", help="Write the HTML report of a recorded "
                                                     "bench.json (into --out, default its folder); runs nothing.",
                                                     show_default=False)] = None,
    compare_: Annotated[tuple[Path, Path] | None, typer.Option("--compare", help="Two recorded bench.json files: "
                                                               "side by side, differences beyond their noise "
                                                               "flagged; runs nothing.", show_default=False)] = None,
    bandwidth_gbs: Annotated[float | None, typer.Option("--bandwidth-gbs", help="The card's memory bandwidth (GB/s) "
                                                        "for the report's bound (default: the datasheet's, for "
                                                        "known cards).", show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run AR and DFlash llama-servers over prompt suites: decode and prompt tok/s, TTFT, acceptance.

    Each server runs the recipe's own flags, as `buun serve` does, with the context pinned (--ctx)
    and the changes given here; bench.json records each server's exact argv."""
    if report_from and compare_:
        raise UsageError("--report-from and --compare are two different commands: pass one of them")
    if bandwidth_gbs is not None and bandwidth_gbs <= 0:
        raise UsageError(f"--bandwidth-gbs {bandwidth_gbs:g}: expected the card's memory bandwidth in GB/s, "
                         "for example 936 for an RTX 3090")
    if report_from:
        return _report_from(report_from, out, bandwidth_gbs)
    if compare_:
        return _compare(*compare_, out, json_out)
    # before anything is made: a misspelt suite was refused only after buun synth wrote the pair
    suites, modes = _csv(suite, bench.SUITES, "--suite"), _csv(mode, bench.MODES, "--mode")
    if against and url:
        raise UsageError("--against runs its own servers on both builds; --url measures one running server",
                         "leave out one of them")
    if against:
        build.find_upstream_binary("llama-server")  # before the models are made: say what to build first
    if tree_budget is not None and url:
        raise UsageError("--tree-budget sweeps servers buun starts itself; --url measures one running server",
                         "leave out --url (the synthetic pair is the default), or --tree-budget")
    budgets = bench_configs.tree_budgets(tree_budget) if tree_budget is not None else []
    levels = _levels(concurrency) if concurrency is not None else []
    if levels and url:
        raise UsageError("--concurrency starts servers of N slots itself; --url measures one running server",
                         "leave out --url (the synthetic pair is the default), or --concurrency")
    if rpc and url:
        raise UsageError("--rpc starts servers split over the workers; --url measures one running server",
                         "leave out one of them")
    r = recipes.load(recipe)
    models = paths.models_dir(models_dir)
    if recipe_models:
        if target or drafter or url or scale:
            raise UsageError("--recipe-models benches the recipe's pair: it takes no --target, --drafter, --url "
                             "or --scale (the synthetic pair's)", "leave out one of them")
        target, drafter = spec.default_models(r, models)  # not pulled or converted: says what to run
    where = None  # the cards, as `buun serve` splits over them (none named: llama-server's own choice)
    if not url and (gpus or r.gpus or draft_gpu is not None):
        where = devices.placement(r, devices.parse_gpus(gpus) if gpus else None, draft_gpu,
                                  build.find_binary("llama-server"))
    overrides = bench_configs.common(ctx, draft_max, host_sampling, shlex.split(server_args))
    if synthetic_al or al_sweep:  # the lengths given, each one a server can feign, then the sweep's it can
        n_max = bench_configs.draft_length(r, overrides, models)
        bench_configs.check_synthetic_lengths(synthetic_al or [], n_max)
        synthetic_al = bench_configs.synthetic_lengths(synthetic_al, al_sweep, n_max) or None
    workers = _workers(rpc, r, where, overrides) if rpc else None
    # a tree that cannot be served: refused before the models; random weights accept nothing of their
    # own, so buun synth's trees feign the calibrated profile's acceptance, real models' their own
    _check_models(target, drafter, url)
    random_weights = target is None or model_plan.is_synthetic(target)
    trees = bench_configs.tree_configs(budgets, r, overrides, models, synthetic=random_weights)
    cfgs = bench_configs.configs(not no_ar, synthetic_al, trees)
    cfgs += bench_configs.concurrency_configs(levels, cfgs, ctx)
    alone = bench_configs.without_twin(cfgs) if against else []
    if alone:
        console.warn(f"--against upstream: {', '.join(c.name for c in alone)} run on buun's build only "
                     "(upstream llama.cpp has no tree verification, and its DFlash slots need patches 0011 and 0024)")
    if url:  # after every usage check: a server not started is said before a run folder is made
        url = bench.check_url(url)
    t, d, note = (None, None, "running server") if url else _bench_models(r, target, drafter, scale, models)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = out or paths.bench_dir() / stamp
    forced = bool(synthetic_al or (trees and random_weights))
    opts = bench.BenchOptions(
        target=t, drafter=d, url=url, suites=suites, modes=modes, prompts=prompts or None, n_predict=n_predict,
        repeats=repeats,
        recipe=r, configs=bench_configs.against_upstream(cfgs) if against else cfgs, overrides=overrides,
        models_dir=models, out_dir=out_dir, load_timeout=load_timeout,
        models_note=note + (", acceptance forced" if forced else ""), bandwidth_gbs=bandwidth_gbs, where=where,
        workers=workers)
    if report_:
        chart.require()  # before the servers run, not after: the report is what was asked for
    if not forced and t is not None and target is None:
        console.warn("random-weight models accept almost no draft: pass --synthetic-al to measure step cost")
    result = bench.run(opts)
    json_path = bench.write_json(result, out_dir / "bench.json")
    if json_out:
        console.print_json(result.to_json())
    else:
        console.out.print(bench.table(result))
        several = bench.concurrency_table(result)
        if several is not None:
            console.out.print(several)
        for line in bench.per_position(result):
            console.info(f"acceptance by position: {line}")
        verdict = bench.tree_verdict(result.to_json())
        if verdict:
            console.ok(verdict)
    console.ok(f"results: {json_path}")
    try:
        console.ok(f"chart: {bench.write_chart(result, out_dir / 'bench.png')}")
    except NotReadyError as exc:  # matplotlib is optional: the JSON above is the result
        _no_chart(exc)
        return
    if report_:
        console.ok(f"report: {report.write(result.to_json(), out_dir / 'report.html')}")


def _check_models(target: Path | None, drafter: Path | None, url: str | None) -> None:
    """--target and --drafter name files there, checked before a run folder is made and a server
    started (which failed to load them); neither was a word said when it was ignored: a --drafter
    without a --target (the synthetic pair ran), either with --url (the running server's ran)."""
    if url and (target or drafter):
        raise UsageError("--target and --drafter are the models of servers bench starts; --url measures one "
                         "running server", "leave out one of them")
    if drafter and not target:
        raise UsageError("--drafter needs --target: without one, bench runs buun synth's pair, drafter included",
                         "pass --target TARGET.gguf too, or leave out --drafter")
    for option, path in (("--target", target), ("--drafter", drafter)):
        if path is None:
            continue
        problem = gguf_tools.not_a_file(path, f"{option} {path}", option)
        if problem:
            raise problem
        if not path.is_file():
            raise UsageError(f"{option} {path} does not exist", "pass the path of an existing GGUF")


def _workers(value: str, recipe: recipes.Recipe, where: devices.Placement | None,
             overrides: bench_configs.Overrides) -> bench_configs.Workers:
    """--rpc: the workers, each asked now (before the models are made), and the drafter's device
    among theirs and this host's (a -dev or -devd of the recipe or --server-args decides), as `buun
    serve --rpc` places it."""
    endpoints = addresses.parse(value)
    spec.check_one_split(endpoints, where)
    flags = command.merge(command.recipe_flags(recipe.server_flags), overrides.set, overrides.drop)
    placed = spec.with_workers(str(build.find_binary("llama-server")), endpoints, flags, True,
                               where.env if where else None)
    return bench_configs.Workers(tuple(endpoints), placed.draft_device)


def _levels(value: str) -> list[int]:
    """--concurrency 2,4: requests at once, each level servers of that many slots."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(command.is_count(v) and 1 <= int(v) <= recipes.MAX_SLOTS for v in items):
        raise UsageError(f"--concurrency {value!r}: expected a comma-separated list of request counts, "
                         f"1 to {recipes.MAX_SLOTS}", "for example --concurrency 4, or --concurrency 2,4,8")
    return [int(v) for v in items]


def _no_chart(exc: NotReadyError) -> None:
    console.warn(f"no chart: {exc.message}; {exc.hint}")  # literal text: the hint's [bench] stays


def _report_from(path: Path, out: Path | None, bandwidth_gbs: float | None) -> None:
    data = bench.read_json(path)
    html_path = report.write(data, (out or path.parent) / "report.html", bandwidth_gbs)
    console.ok(f"report: {html_path}")


def _compare(a_path: Path, b_path: Path, out: Path | None, json_out: bool) -> None:
    a, b = bench.read_json(a_path), bench.read_json(b_path)
    result = compare.compare(a, b, a_path, b_path)
    for w in result.warnings:
        console.warn(w)
    if json_out:
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
    out_dir = out or paths.bench_dir() / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    console.ok(f"chart: {chart.save(fig, out_dir / 'compare.png')}")


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import MEASURE

    app.command("synth", rich_help_panel=MEASURE)(synth_cmd)
    app.command("bench", rich_help_panel=MEASURE)(bench_cmd)
