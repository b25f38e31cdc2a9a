"""`buun tune`: measure AR, the chain and trees on this card with these models, pick the fastest,
and keep it as the recipe's tuned overlay (server/tuned.py) with its evidence.

    plan(opts) -> Plan            the candidates in the order measured, and those that cannot run
    run(opts) -> TuneResult       each candidate's server over the workload, within the time budget
    pick(measured) -> (name, why) the fastest eligible; near-ties go to the simpler

The candidates: AR; the chain at the recipe's draft length; trees at each budget the ubatch holds
(15 and 22 by default); the chain at about half the draft length. Each runs the workload's prompts
in its forms of request (bench_prompts.ALL_MODES) through `buun bench`'s own servers and requests
(bench_run.run_config), so a tune's bench.json reads as any bench run's. On random-weight models
(`buun synth`) every DFlash candidate feigns the tree profile's acceptance (treeprofile.py), and
the greedy check is moot; on real models each DFlash candidate's greedy output must be AR's
(tune_check.py). AR and the recipe's chain always run; the others run while the time budget
allows, and those left out are named.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buun_tool.base import command, console
from buun_tool.base import tree_budget as budgets
from buun_tool.base.errors import UsageError
from buun_tool.formats import model_plan, recipes
from buun_tool.measure import bench, bench_configs, bench_long, bench_summary, treeprofile
from buun_tool.measure.bench_configs import Overrides, ServerConfig
from buun_tool.measure.bench_prompts import GREEDY_MODES, load_prompts
from buun_tool.measure.bench_run import BenchOptions, ConfigRun, binaries, run_config
from buun_tool.measure.tune_check import GreedyCheck, Verdict
from buun_tool.server.tuned import Choice

# workload -> (suites, forms of request): what a user of that kind sends
WORKLOADS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "code": (("code",), ("raw", "chat", "chat-sampled")),
    "prose": (("prose",), ("raw", "chat", "chat-sampled")),
    "chat": (("code", "prose"), ("chat", "chat-nothink", "chat-sampled")),
    "long": ((bench_long.SUITE,), ("chat",)),
    "mixed": (("code", "math", "prose"), ("raw", "chat", "chat-nothink", "chat-sampled")),
}
TREE_BUDGETS = (15, 22)
TIE = 0.02  # tok/s within 2% of the fastest: a near-tie, which goes to the simpler configuration
DEFAULT_BUDGET_S = 180.0  # a 3090 measures the five candidates of the code workload in about that


@dataclass
class TuneOptions:
    recipe: recipes.Recipe
    target: Path
    drafter: Path
    models_dir: Path
    out_dir: Path
    workload: str = "code"
    prompts: int = 2  # per suite
    n_predict: int = 128
    budget_s: float = DEFAULT_BUDGET_S
    tree_budgets: tuple[int, ...] = TREE_BUDGETS
    profile: str | None = None  # feigned acceptance (--spec-synth-tree's value); None: the drafter's own
    long_sizes: tuple[int, ...] = (bench_long.SIZES[-1],)
    check_tokens: int = 48
    load_timeout: float = 300.0

    @property
    def feigned(self) -> bool:
        return self.profile is not None


def default_profile(target: Path) -> str | None:
    """The calibrated profile on random weights (which accept nothing of their own), else None."""
    return treeprofile.synth_tree_value(treeprofile.DEFAULT) if model_plan.is_synthetic(target) else None


@dataclass(frozen=True)
class Candidate:
    choice: Choice
    config: ServerConfig


@dataclass
class Plan:
    candidates: list[Candidate]
    skipped: list[str] = field(default_factory=list)  # cannot run here, and why
    overrides: Overrides = field(default_factory=Overrides)


def _candidate(choice: Choice, profile: str | None) -> Candidate:
    if choice.kind == "ar":
        return Candidate(choice, bench_configs.AR)
    sets: list[command.Flag] = [(command.TREE_BUDGET, str(choice.tree_budget)), ("--draft-max", str(choice.draft_max))]
    if choice.kind == "tree":
        sets.append((command.TREE_K, str(treeprofile.K)))
    if profile is not None:
        sets.append(("--spec-synth-tree", profile))
    label = f"DFlash {choice.describe()}" + (" (feigned acceptance)" if profile else "")
    return Candidate(choice, ServerConfig(choice.name, label, True, Overrides(set=tuple(sets)),
                                          tree_budget=choice.tree_budget))


def context_for(opts: TuneOptions) -> int:
    suites, _ = WORKLOADS[opts.workload]
    if bench_long.SUITE in suites:
        return bench_long.context_for(opts.long_sizes, opts.n_predict)
    return bench_configs.DEFAULT_CTX


def check_workload(workload: str) -> None:
    if workload not in WORKLOADS:
        raise UsageError(f"--workload {workload!r}: expected one of {', '.join(WORKLOADS)}")


def plan(opts: TuneOptions) -> Plan:
    """AR, the recipe's chain, the trees the ubatch holds, the shorter chain: in the order measured."""
    check_workload(opts.workload)
    overrides = bench_configs.common(context_for(opts))
    n = bench_configs.draft_length(opts.recipe, overrides, opts.models_dir)
    choices = [Choice("ar"), Choice("chain", n)]
    choices += [Choice("tree", n, b) for b in opts.tree_budgets if budgets.is_tree(b)]
    if n > 1:
        choices.append(Choice("chain", math.ceil(n / 2)))
    out = Plan([], overrides=overrides)
    for c in choices:
        cand = _candidate(c, opts.profile)
        try:  # a tree the ubatch cannot hold is refused by the same check serve makes
            bench_configs.settings_of(opts.recipe, cand.config, overrides, opts.models_dir)
        except UsageError as exc:
            out.skipped.append(f"{c.describe()}: {exc.message}")
            continue
        out.candidates.append(cand)
    return out


@dataclass
class Measured:
    choice: Choice
    decode_tps: float | None
    prompt_tps: float | None
    ttft_ms: float | None
    mean_al: float | None
    greedy: Verdict | None  # None: not checked (AR, or acceptance feigned)
    seconds: float

    @property
    def eligible(self) -> bool:
        return self.greedy is None or self.greedy.ok

    def to_json(self) -> dict[str, Any]:
        return {"config": self.choice.name, "choice": self.choice.describe(), "decode_tps": self.decode_tps,
                "prompt_tps": self.prompt_tps, "ttft_ms": self.ttft_ms, "mean_al": self.mean_al,
                "greedy": self.greedy.to_json() if self.greedy else None, "seconds": round(self.seconds, 1)}


def _simplicity(c: Choice, recipe_n: int) -> tuple[int, int, int]:
    """Smaller is simpler: AR, then the chain (the recipe's length first), then trees by budget."""
    return ({"ar": 0, "chain": 1, "tree": 2}[c.kind], c.tree_budget, 0 if c.draft_max in (None, recipe_n) else 1)


def pick(measured: list[Measured], recipe_n: int, tie: float = TIE) -> tuple[Measured, str]:
    """The fastest eligible configuration by decode tok/s; one within `tie` of it that is simpler
    wins instead (AR over DFlash, chain over tree, shorter tree over longer)."""
    ok = [m for m in measured if m.eligible and m.decode_tps]
    if not ok:
        raise UsageError("no configuration measured a decode speed", "see the servers' logs in the tune's folder")
    best = max(ok, key=lambda m: m.decode_tps or 0.0)
    near = [m for m in ok if (m.decode_tps or 0.0) >= (best.decode_tps or 0.0) * (1 - tie)]
    chosen = min(near, key=lambda m: _simplicity(m.choice, recipe_n))
    ar = next((m for m in measured if m.choice.kind == "ar"), None)
    why = f"{chosen.decode_tps:.1f} tok/s"
    if chosen is not best:
        why += f", within {tie:.0%} of {best.choice.describe()}'s {best.decode_tps:.1f} and simpler"
    if chosen.choice.kind == "ar" and ar is not None:
        dflash = [m for m in ok if m.choice.kind != "ar"]
        fastest = max(dflash, key=lambda m: m.decode_tps or 0.0) if dflash else None
        why = (f"DFlash's best here, {fastest.choice.describe()}, ran at "
               f"{(fastest.decode_tps or 0) / (ar.decode_tps or 1):.2f}x AR's {ar.decode_tps:.1f} tok/s"
               if fastest else "no DFlash configuration passed the greedy check")
    return chosen, why


def _aggregate(run: ConfigRun) -> tuple[float | None, float | None, float | None, float | None]:
    """decode tok/s, prefill tok/s, mean TTFT and mean AL over every request of a run, as bench
    summarises a suite's (bench_summary.row_of)."""
    r = bench_summary.row_of(run, "all", "all", run.samples)
    return r["decode_tps"], r["prompt_tps"], r["ttft_ms"], r["mean_al"]


@dataclass
class TuneResult:
    measured: list[Measured]
    picked: Measured
    why: str
    cut: list[str]
    skipped: list[str]
    seconds: float
    bench: bench.BenchResult
    forms: list[dict[str, Any]]  # per form of request: AR's and the pick's tok/s and acceptance

    def ratio(self, kind: str) -> float | None:
        """The pick's tok/s over AR's ("ar") or over the recipe's chain ("chain")."""
        base = next((m for m in self.measured if m.choice.kind == kind), None)
        if base is None or base is self.picked or not base.decode_tps or not self.picked.decode_tps:
            return None
        return self.picked.decode_tps / base.decode_tps


Progress = Callable[[str], None]


def run(opts: TuneOptions, progress: Progress = console.step) -> TuneResult:
    """Every candidate while the budget lasts (AR and the recipe's chain always), then the pick."""
    t0 = time.monotonic()
    p = plan(opts)
    suites_names, forms = WORKLOADS[opts.workload]
    loaded = {s: load_prompts(s, opts.prompts, opts.long_sizes) for s in suites_names}
    suites = {s: prompts for s, (prompts, _) in loaded.items()}
    bopts = BenchOptions(opts.models_dir, opts.target, opts.drafter, suites=suites_names, modes=forms,
                         prompts=opts.prompts, long_sizes=opts.long_sizes, n_predict=opts.n_predict,
                         recipe=opts.recipe, configs=[c.config for c in p.candidates], overrides=p.overrides,
                         out_dir=opts.out_dir, load_timeout=opts.load_timeout,
                         models_note="random weights, acceptance feigned" if opts.feigned else "the recipe's models")
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    check = GreedyCheck(load_prompts("code", 2)[0], opts.check_tokens)
    found = binaries(bopts.configs)
    runs: list[ConfigRun] = []
    measured: list[Measured] = []
    cut: list[str] = []
    for i, cand in enumerate(p.candidates):
        if i >= 2 and _over_budget(measured, t0, opts.budget_s):
            cut = [c.choice.describe() for c in p.candidates[i:]]
            break
        progress(f"tune {i + 1}/{len(p.candidates)}: {cand.config.label}")
        start, verdict = time.monotonic(), [None]
        during = _checker(cand, check, opts.feigned, verdict)
        r = run_config(cand.config, found[cand.config.build], suites, bopts, during)
        runs.append(r)
        measured.append(Measured(cand.choice, *_aggregate(r), verdict[0], time.monotonic() - start))
    bopts.configs = [r.config for r in runs]
    result = bench.record(bopts, {s: src for s, (_, src) in loaded.items()}, suites, runs)
    picked, why = pick(measured, p.candidates[1].choice.draft_max or 0)
    return TuneResult(measured, picked, why, cut, p.skipped, time.monotonic() - t0, result,
                      forms_table(result.rows, picked.choice.name))


def _checker(cand: Candidate, check: GreedyCheck, feigned: bool, out: list[Any]) -> Callable[[str], None] | None:
    """What runs while a candidate's server is up: AR records the reference, DFlash compares."""
    if feigned:
        return None
    if cand.choice.kind == "ar":
        return check.record

    def compare(url: str) -> None:
        out[0] = check.compare(url)
    return compare


def _over_budget(measured: list[Measured], t0: float, budget_s: float) -> bool:
    """Would the next candidate end past the budget, taking as long as the longest DFlash one so far?"""
    dflash = [m.seconds for m in measured if m.choice.kind != "ar"] or [m.seconds for m in measured]
    return time.monotonic() - t0 + max(dflash) > budget_s


def forms_table(rows: list[dict[str, Any]], picked: str) -> list[dict[str, Any]]:
    """Per form of request (and suite): AR's tok/s and the pick's, with its acceptance, so that a
    user sees what the chat template (or thinking) costs with this drafter."""
    out = []
    for row in rows:
        if row["config"] != picked or picked == "ar":
            continue
        ar = next((r for r in rows if r["config"] == "ar" and (r["suite"], r["mode"]) == (row["suite"], row["mode"])),
                  None)
        out.append({"suite": row["suite"], "form": row["mode"], "greedy": row["mode"] in GREEDY_MODES,
                    "decode_tps": row["decode_tps"], "ar_tps": ar["decode_tps"] if ar else None,
                    "speedup": row["speedup"], "mean_al": row["mean_al"], "accept_rate": row["accept_rate"]})
    return out
