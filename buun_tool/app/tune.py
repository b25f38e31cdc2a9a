"""`buun tune` as a stage: the models and card resolved, the measurement run (measure/tune.py), its
evidence written and the pick kept as the recipe's tuned overlay (server/tuned.py).

    prepare(recipe, models_dir, ...) -> TuneOptions      the recipe's pair, or the files given
    tune(opts) -> Outcome                                 measured, picked, written, saved
    stage_status(recipe, models_dir, cpu) -> StageStatus  current when a fresh tune exists (setup)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buun_tool.base import console, paths
from buun_tool.base.errors import NotReadyError, UsageError
from buun_tool.formats import gguf_tools, recipes
from buun_tool.measure import bench, report, treeprofile
from buun_tool.measure import tune as measure
from buun_tool.measure.tune import TuneOptions, TuneResult
from buun_tool.pipeline import build, doctor
from buun_tool.pipeline.stage import StageStatus, current, stale
from buun_tool.plan import devices
from buun_tool.server import control, spec, tuned
from buun_tool.server.instance import Instance
from buun_tool.server.state import State


def parse_profile(value: str | None, target: Path) -> str | None:
    """--tree-profile, as llama-server's --spec-synth-tree value: `calibrated` (the default on random
    weights), `real` (None: the drafter's own acceptance; the default on real models), U:HARD_TOP1
    (treeprofile.Profile) or a whole U:E1,...,EK:H1,...,HK."""
    if value is None:
        return measure.default_profile(target)
    if value == "real":
        return None
    if value == "calibrated":
        return treeprofile.synth_tree_value(treeprofile.DEFAULT)
    hint = "for example --tree-profile 0.28:0.68, or U:E1,...,EK:H1,...,HK (--spec-synth-tree's value)"
    parts = value.split(":")
    try:
        if len(parts) == 3:
            treeprofile.parse_synth_tree(value)
            return value
        u, top1 = (float(x) for x in parts)
    except ValueError as exc:
        raise UsageError(f"--tree-profile {value!r}: expected calibrated, real, U:HARD_TOP1 or a --spec-synth-tree "
                         f"value ({exc})", hint) from None
    if not (0 <= u <= 1 and 0 <= top1 <= treeprofile.HARD_MASS):
        raise UsageError(f"--tree-profile {value!r}: U runs from 0 to 1, HARD_TOP1 from 0 to {treeprofile.HARD_MASS}",
                         hint)
    return treeprofile.synth_tree_value(treeprofile.Profile(u, top1))


def prepare(r: recipes.Recipe, models_dir: Path, target: Path | None = None, drafter: Path | None = None,
            profile: str | None = None, out: Path | None = None, **options: Any) -> TuneOptions:
    """The tune of the recipe's pair (the files `buun setup` made), or of --target and --drafter."""
    measure.check_workload(options.get("workload", "code"))  # a mistyped option before missing files
    if (target is None) != (drafter is None):
        raise UsageError("--target and --drafter go together", "pass both, or neither for the recipe's pair")
    if target is None or drafter is None:
        target, drafter = spec.default_models(r, models_dir)
    for option, path in (("--target", target), ("--drafter", drafter)):
        gguf_tools.check_given(option, path)
    out_dir = out or paths.tune_runs_dir() / f"{r.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return TuneOptions(r, target, drafter, models_dir, out_dir, profile=parse_profile(profile, target), **options)


def serving(recipe: recipes.Recipe) -> Instance | None:
    """The recipe's instance when a server of it runs (or starts) now: it would share the card with
    every measured one."""
    inst = Instance(recipe.name)
    return inst if control.status(inst).state not in (State.STOPPED, State.FAILED) else None


def check_card_free(recipe: recipes.Recipe) -> None:
    if serving(recipe) is not None:
        raise UsageError(f"{recipe.name} is being served now: its memory and requests would distort every "
                         "measurement", f"`buun stop {recipe.name}`, then tune (setup stops and restarts it itself)")


def key_of(opts: TuneOptions) -> tuned.Key:
    binary = build.find_binary("llama-server")
    where = devices.placement(opts.recipe, None, None, binary)
    cards = tuned.cards_of(where, build.variant_of(binary) == "cpu")
    return tuned.key_for(opts.recipe.name, cards, binary, opts.target, opts.drafter)


@dataclass
class Outcome:
    result: TuneResult
    tuned: tuned.Tuned
    saved: Path
    files: dict[str, Path]


def tune(opts: TuneOptions) -> Outcome:
    """Measure, pick, write the evidence and keep the pick (server/tuned.py)."""
    key = key_of(opts)
    result = measure.run(opts)
    files = write_evidence(result, opts)
    picked = result.picked
    record = tuned.Tuned(key, picked.choice, time.strftime("%Y-%m-%d"), opts.workload, picked.decode_tps or 0.0,
                         result.ratio("ar"), result.ratio("chain") if picked.choice.kind == "tree" else None,
                         reason=result.why if picked.choice.kind == "ar" else "", evidence=str(opts.out_dir),
                         seconds=round(result.seconds, 1), cut=result.cut)
    return Outcome(result, record, tuned.save(record), files)


def to_json(result: TuneResult, opts: TuneOptions) -> dict[str, Any]:
    return {"workload": opts.workload, "budget_s": opts.budget_s, "seconds": round(result.seconds, 1),
            "feigned_acceptance": opts.profile,
            "measured": [m.to_json() for m in result.measured], "picked": result.picked.choice.name,
            "why": result.why, "vs_ar": result.ratio("ar"), "vs_chain": result.ratio("chain"),
            "cut": result.cut, "skipped": result.skipped, "forms": result.forms}


def write_evidence(result: TuneResult, opts: TuneOptions) -> dict[str, Path]:
    """bench.json (as `buun bench` writes it), tune.json (the decision) and, with matplotlib, the report."""
    files = {"bench": bench.write_json(result.bench, opts.out_dir / "bench.json"),
             "tune": opts.out_dir / "tune.json"}
    files["tune"].write_text(json.dumps(to_json(result, opts), indent=1) + "\n")
    try:
        files["report"] = report.write(result.bench.to_json(), opts.out_dir / "report.html")
    except NotReadyError as exc:  # matplotlib is optional: the JSON is the evidence
        console.info(f"no report: {exc.message}")
    return files


def doctor_check(recipe: recipes.Recipe, models_dir: Path) -> doctor.Check:
    """`buun doctor`'s line for the recipe's tune on this card: fresh, stale (what changed) or none."""
    try:
        spec.default_models(recipe, models_dir)
        build.find_binary("llama-server")
    except NotReadyError as exc:
        return doctor.Check("tune", "warn", f"nothing to tune yet: {exc.message}", "buun setup", required=False)
    status = stage_status(recipe, models_dir)
    if status.current:
        return doctor.Check("tune", "ok", status.detail, required=False)
    return doctor.Check("tune", "warn", status.detail, f"buun tune {recipe.ref}", required=False)


def stage_status(recipe: recipes.Recipe, models_dir: Path) -> StageStatus:
    """setup's tune stage: current when the recipe's pair has a fresh tune on this card and build."""
    try:
        target, drafter = spec.default_models(recipe, models_dir)
        binary = build.find_binary("llama-server")
    except NotReadyError as exc:
        return stale(exc.message)
    where = devices.placement(recipe, None, None, binary)
    found = tuned.find(recipe.name, where, build.variant_of(binary) == "cpu", binary, target, drafter)
    return current(found.status()) if found.fresh else stale(found.status())
