"""A run of `buun bench` made ready from its request: the recipe, the models (the recipe's pair,
the files given or buun synth's), the cards and RPC workers as `buun serve` uses them, the
command line's overrides and every server configuration, each checked before anything is made.

    prepare(request, scale_of) -> BenchOptions     for bench.run
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

from buun_tool.base import command, console, paths
from buun_tool.base.errors import UsageError
from buun_tool.formats import gguf_tools, model_plan, recipes
from buun_tool.measure import bench_configs, chart, synth
from buun_tool.measure.bench_client import check_url
from buun_tool.measure.bench_request import BenchRequest
from buun_tool.measure.bench_run import BenchOptions
from buun_tool.pipeline import build
from buun_tool.plan import devices
from buun_tool.server import addresses, spec, tuned

# --scale of the synthetic models, resolved (the command's: full where a GPU runs them, else tiny)
ScaleOf = Callable[[str | None], str]


def prepare(req: BenchRequest, scale_of: ScaleOf) -> BenchOptions:
    """The options of the run `req` asks for (a run's request: req.job == "run"). Every check comes
    before the synthetic pair is written and the run folder named; with --report, matplotlib is
    asked for before any server runs (the report is what was asked for)."""
    r = recipes.load(req.recipe)
    models = paths.models_dir(req.models_dir)
    target, drafter = req.target, req.drafter
    if req.recipe_models:
        if target or drafter or req.url or req.scale:
            raise UsageError("--recipe-models benches the recipe's pair: it takes no --target, --drafter, --url "
                             "or --scale (the synthetic pair's)", "leave out one of them")
        target, drafter = spec.default_models(r, models)  # not pulled or converted: says what to run
    where = None  # the cards, as `buun serve` splits over them (none named: llama-server's own choice)
    if not req.url and (req.gpus or r.gpus or req.draft_gpu is not None):
        where = devices.placement(r, devices.parse_gpus(req.gpus) if req.gpus else None, req.draft_gpu,
                                  build.find_binary("llama-server"))
    overrides = bench_configs.common(req.ctx, req.draft_max, req.host_sampling, shlex.split(req.server_args))
    synthetic_al = list(req.synthetic_al) or None
    if synthetic_al or req.al_sweep:  # the lengths given, each one a server can feign, then the sweep's it can
        n_max = bench_configs.draft_length(r, overrides, models)
        bench_configs.check_synthetic_lengths(synthetic_al or [], n_max)
        synthetic_al = bench_configs.synthetic_lengths(synthetic_al, req.al_sweep, n_max) or None
    workers = _workers(req.rpc, r, where, overrides) if req.rpc else None
    # a tree that cannot be served: refused before the models; random weights accept nothing of their
    # own, so buun synth's trees feign the calibrated profile's acceptance, real models' their own
    _check_models(target, drafter, req.url)
    random_weights = target is None or model_plan.is_synthetic(target)
    trees = bench_configs.tree_configs(list(req.tree_budgets), r, overrides, models, synthetic=random_weights)
    cfgs = bench_configs.configs(not req.no_ar, synthetic_al, trees)
    cfgs += bench_configs.concurrency_configs(list(req.levels), cfgs, req.ctx)
    alone = bench_configs.without_twin(cfgs) if req.against else []
    if alone:
        console.warn(f"--against upstream: {', '.join(c.name for c in alone)} run on buun's build only "
                     "(upstream llama.cpp has no tree verification, and its DFlash slots need patches 0011 and 0024)")
    url = check_url(req.url) if req.url else req.url  # after every usage check: said before a run folder is made
    t, d, note = (None, None, "running server") if url else _models(r, target, drafter, req.scale, scale_of, models)
    forced = bool(synthetic_al or (trees and random_weights))
    opts = BenchOptions(
        target=t, drafter=d, url=url, suites=req.suites, modes=req.modes, prompts=req.prompts or None,
        long_sizes=req.long_sizes,
        n_predict=req.n_predict, repeats=req.repeats, recipe=r,
        configs=bench_configs.against_upstream(cfgs) if req.against else cfgs, overrides=overrides,
        models_dir=models, out_dir=req.out or paths.bench_dir() / time.strftime("%Y%m%d-%H%M%S"),
        load_timeout=req.load_timeout, models_note=note + (", acceptance forced" if forced else ""),
        bandwidth_gbs=req.bandwidth_gbs, where=where, workers=workers,
        tuned=None if req.untuned or url else _tuned(r, where, t, d))
    if req.report:
        chart.require()  # before the servers run, not after: the report is what was asked for
    if not forced and t is not None and target is None:
        console.warn("random-weight models accept almost no draft: pass --synthetic-al to measure step cost")
    return opts


def _tuned(r: recipes.Recipe, where: devices.Placement | None, target: Path | None, drafter: Path | None
           ) -> tuned.Tuned | None:
    """The fresh tune of these models on this card, said when applied; a tune that picked AR is
    not (the DFlash configurations are what a bench measures against AR)."""
    if target is None:
        return None
    binary = build.find_binary("llama-server")
    found = tuned.find(r.name, where, build.variant_of(binary) == "cpu", binary, target, drafter)
    if found.fresh is None or found.fresh.choice.kind == "ar":
        return None
    console.info(f"DFlash servers run the tune of these models: {found.fresh.note} (--untuned: the recipe's)")
    return found.fresh


def _models(r: recipes.Recipe, target: Path | None, drafter: Path | None, scale: str | None, scale_of: ScaleOf,
            models: Path) -> tuple[Path, Path | None, str]:
    """The files given, else buun synth's pair (written now, or found written before)."""
    if target:
        return target, drafter, f"models: {target.name}" + (f" + {drafter.name}" if drafter else "")
    s = scale_of(scale)
    t, d = synth.write_pair(r, paths.synthetic_models_dir(models), scale=s)
    return t, d, f"synthetic {s} models (random weights)"


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
        if path is not None:
            gguf_tools.check_given(option, path)


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
