"""The llama-server configurations `buun bench` measures, as data: the recipe's own server flags
(what `buun serve` runs) changed by named overrides, the same way `buun serve -- FLAGS --drop FLAG`
changes them, and resolved and rendered by the same code (server.settings).

    configs(ar=True, synthetic_al=[1.0, 7.67])   -> [ar, dflash-al1, dflash-al7.67]
    tree_configs([0, 8], recipe, common, models_dir) -> [dflash-tree0, dflash-tree8]   (--tree-budget)
    concurrency_configs([4], configs, ctx)           -> [ar-c4, dflash-c4]   (--concurrency: 4 requests at once)
    against_upstream(configs)                    -> each, then its twin on upstream's build (none for a tree)
    launch(recipe, cfg, Models(...), binary, port, common, models_dir) -> the exact llama-server argv and env

A configuration is a name, a label, whether it runs the drafter, and its Overrides; a sweep adds
configurations by making more of them. Overrides apply in order: the bench command line's to
every configuration (`common`: the context, --draft-max, --host-sampling, --server-args), then the
configuration's own, then the build's (UPSTREAM for unpatched llama.cpp). `models_dir` is the
models folder `buun serve` would weigh for a `-c fit` (bench pins -c unless told otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command
from buun_tool.base import tree_budget as budgets
from buun_tool.base.command import Flag
from buun_tool.base.errors import UsageError
from buun_tool.formats import recipes
from buun_tool.measure import treeprofile
from buun_tool.plan import devices
from buun_tool.server import addresses, settings, spec
from buun_tool.server.settings import Launch, ServerSettings
from buun_tool.server.tuned import DRAFT_OPTIONS, Tuned

AL_SWEEP = tuple(float(al) for al in range(1, 11))  # --al-sweep: the report's tok/s against AL, 1 to 10
DEFAULT_CTX = 6048  # bench pins -c: the recipe's `fit` depends on the card and on the build's rollback


@dataclass(frozen=True)
class Overrides:
    """A change to the recipe's flags. `set`: flags that replace the recipe's flag of the same
    option in any spelling, or are added (`buun serve -- FLAGS`); `drop`: flags left out
    (`buun serve --drop FLAG`); `respell`: pairs ((name, value), (new name, new value)) that give
    a setting the spelling another build knows, in its place (a value None matches any value and
    keeps it)."""

    set: tuple[Flag, ...] = ()
    drop: tuple[str, ...] = ()
    respell: tuple[tuple[Flag, Flag], ...] = ()

    def then(self, later: Overrides) -> Overrides:
        """Both changes, `later` winning where they touch the same option."""
        touched = {command.canonical(n) for n, _ in later.set} | {command.canonical(d) for d in later.drop}
        return Overrides(
            tuple(f for f in self.set if command.canonical(f[0]) not in touched) + later.set,
            tuple(d for d in self.drop if command.canonical(d) not in {command.canonical(n) for n, _ in later.set})
            + later.drop,
            self.respell + later.respell)

    def serve_args(self, recipe_flags: Sequence[Flag]) -> tuple[list[Flag], list[str]]:
        """The same change as `buun serve` takes it: (the flags after `--`, the --drop flags)."""
        merged = command.merge(recipe_flags, self.set, self.drop)
        respelled = [(name, flag[1] if value is None else value) for flag in merged for old, (name, value)
                     in self.respell if _matches(flag, old)]
        keys = {command.canonical(n) for n, _ in respelled}
        return [f for f in self.set if command.canonical(f[0]) not in keys] + respelled, list(self.drop)

    def to_json(self) -> dict[str, Any]:
        return {"set": [list(f) for f in self.set], "drop": list(self.drop),
                "respell": [[list(old), list(new)] for old, new in self.respell]}


def _matches(flag: Flag, pattern: Flag) -> bool:
    return command.canonical(flag[0]) == command.canonical(pattern[0]) and pattern[1] in (None, flag[1])


# What pinned upstream llama.cpp calls the fork's settings the recipe uses (buun's patch 0007 adds
# the fork's names): the same DFlash, draft size and batch; no -cd (upstream's drafter takes the
# target's context), no tree (patch 0023), no verify maximum over slots (0031) and no rests for a
# drafter that keeps missing (0033). `buun bench --against upstream` runs every configuration with it.
UPSTREAM = Overrides(
    drop=("-cd", command.TREE_BUDGET, command.TREE_K, "--spec-verify-max", "--spec-skip-after"),
    respell=((("--spec-type", "dflash"), ("--spec-type", "draft-dflash")),
             (("--draft-max", None), ("--spec-draft-n-max", None)),
             (("--draft-min", None), ("--spec-draft-n-min", None))))


@dataclass(frozen=True)
class ServerConfig:
    """One server of a bench run: `name` keys its rows ("ar", "dflash", "dflash-al7.67", "dflash-tree22")."""

    name: str
    label: str
    spec: bool  # runs the drafter (-md)
    overrides: Overrides = field(default_factory=Overrides)
    synthetic_al: float | None = None  # forced mean acceptance length (--spec-synth-len)
    tree_budget: int | None = None  # a --tree-budget sweep's point (0: the chain)
    expected_al: float | None = None  # the profile's expected AL at that budget (treeprofile)
    build: str = "buun"  # whose llama-server runs it: buun's build, or "upstream" (`buun build --upstream`)
    concurrency: int = 1  # requests in flight at once, on as many slots (--concurrency)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "spec": self.spec, "synthetic_al": self.synthetic_al,
                "tree_budget": self.tree_budget, "expected_al": self.expected_al,
                "overrides": self.overrides.to_json(), "build": self.build, "concurrency": self.concurrency}


AR = ServerConfig("ar", "AR", False, Overrides(drop=DRAFT_OPTIONS))
DFLASH = ServerConfig("dflash", "DFlash", True)


def synthetic(al: float) -> ServerConfig:
    """DFlash with llama-server's synthetic acceptance: the cost of a step at mean length `al`."""
    return ServerConfig(f"dflash-al{al:g}", f"DFlash AL {al:g} (synthetic)", True,
                        Overrides(set=(("--spec-synth-len", f"{al:g}"),)), al)


def synthetic_lengths(given: list[float] | None, sweep: bool, n_max: int | None = None) -> list[float]:
    """The --synthetic-al lengths in the order given, then the sweep's that are not among them and
    that a draft of n_max tokens reaches (at most n_max + 1; every one without n_max)."""
    given = list(given or [])
    top = float("inf") if n_max is None else n_max + 1
    return given + [al for al in AL_SWEEP if sweep and al not in given and al <= top]


def tree(budget: int, draft_max: int | None, synthetic: bool = True) -> ServerConfig:
    """DFlash verifying trees of `budget` draft nodes (patch 0023; 0: the chain). On random weights
    (`synthetic`) under the calibrated tree profile's feigned acceptance, so that every budget, the
    chain included, is measured under the same drafter; the profile's expected AL is that of a
    draft of treeprofile.DEPTH tokens (None for another draft length). On real models with the
    drafter's own acceptance: what the tree gives on this card and these prompts."""
    label = "DFlash chain" if budget <= 1 else f"DFlash tree {budget}"
    sets = ((command.TREE_BUDGET, str(budget)), (command.TREE_K, str(treeprofile.K)))
    if not synthetic:
        return ServerConfig(f"dflash-tree{budget}", label, True, Overrides(set=sets), tree_budget=budget)
    sets += (("--spec-synth-tree", treeprofile.synth_tree_value(treeprofile.DEFAULT)),)
    expected = treeprofile.DEFAULT.served_al(budget) if draft_max == treeprofile.DEPTH else None
    return ServerConfig(f"dflash-tree{budget}", f"{label} (synthetic tree)", True, Overrides(set=sets),
                        tree_budget=budget, expected_al=expected)


def tree_budgets(given: str) -> list[int]:
    """--tree-budget's budgets ("8,16,22,32"), the chain (0) first and each once (1 is the chain too)."""
    return budgets.parse_list(given, "--tree-budget")


def draft_length(recipe: recipes.Recipe, overrides: Overrides, models_dir: Path) -> int:
    """The DFlash servers' draft length: their --draft-max, which llama-server clamps to the
    drafter's block less one."""
    most = recipe.geometry_at("full").drafter.block_size - 1
    given = command.option(dict(settings_of(recipe, DFLASH, overrides, models_dir).flags), "--draft-max")
    return min(int(given), most) if command.is_count(str(given)) else most


def check_synthetic_lengths(lengths: Sequence[float], n_max: int) -> None:
    """Refuse, before any server runs, a --synthetic-al llama-server would refuse at load: a mean
    acceptance length runs from 1 (every drafted token rejected) to n_max + 1 (all accepted)."""
    for al in lengths:
        if not math.isfinite(al) or not 1.0 <= al <= n_max + 1:
            raise UsageError(f"--synthetic-al {al:g}: expected a mean acceptance length from 1 (every drafted token "
                             f"rejected) to {n_max + 1} (all {n_max} drafted tokens accepted, and the target's)",
                             "for example --synthetic-al 7.67 (the HumanEval chain's); --draft-max sets the drafted "
                             "tokens")


def tree_configs(budgets: Sequence[int], recipe: recipes.Recipe, overrides: Overrides,
                 models_dir: Path, synthetic: bool = True) -> list[ServerConfig]:
    """One DFlash server per budget of the sweep (`tree`) at the servers' draft length
    (`draft_length`), each resolved here, so that a tree the servers' ubatch cannot hold is refused
    before any server runs (settings.with_tree)."""
    n_max = draft_length(recipe, overrides, models_dir)
    out = [tree(b, n_max, synthetic) for b in budgets]
    for cfg in out:
        settings_of(recipe, cfg, overrides, models_dir)
    return out


def configs(ar: bool, synthetic_al: list[float] | None, trees: Sequence[ServerConfig] = ()) -> list[ServerConfig]:
    """AR (unless left out), then one DFlash server per synthetic length and the tree sweep's
    servers (`tree_configs`), or one DFlash server with real acceptance when there are neither."""
    out = ([AR] if ar else []) + [synthetic(al) for al in synthetic_al or []] + list(trees)
    return out if synthetic_al or trees else [*out, DFLASH]


def at_once(cfg: ServerConfig, n: int, ctx: int = DEFAULT_CTX) -> ServerConfig:
    """`cfg` on a server of n slots fed n requests at once: -np n and -c n times `ctx`, the context
    one request has alone (settings.with_slots raises -ub to hold every slot's verify, as `buun serve
    --slots` does)."""
    sets = (("-np", str(n)), ("-c", str(ctx * n)))
    return replace(cfg, name=f"{cfg.name}-c{n}", label=f"{cfg.label}, {n} at once",
                   overrides=cfg.overrides.then(Overrides(set=sets)), concurrency=n)


def concurrency_configs(levels: Sequence[int], cfgs: Sequence[ServerConfig], ctx: int = DEFAULT_CTX
                        ) -> list[ServerConfig]:
    """For each level above 1 (--concurrency 2,4), every AR and chain DFlash configuration `at_once`.
    A tree verifies one slot (patch 0023): the tree sweep's configurations have none."""
    for n in levels:
        if not 1 <= n <= recipes.MAX_SLOTS:
            raise UsageError(f"--concurrency {n}: expected 1 to {recipes.MAX_SLOTS} requests at once",
                             "for example --concurrency 4 (buun serves up to 8 slots)")
    return [at_once(c, n, ctx) for n in sorted(set(levels)) if n > 1 for c in cfgs if c.tree_budget is None]


def upstream_name(name: str) -> str:
    """The name of a configuration's twin on upstream's build."""
    return f"{name}-upstream"


def on_upstream(cfg: ServerConfig) -> ServerConfig:
    """The same configuration on the unpatched pin: its overrides, then the upstream set."""
    return replace(cfg, name=upstream_name(cfg.name), label=f"{cfg.label}, upstream",
                   overrides=cfg.overrides.then(UPSTREAM), build="upstream")


def against_upstream(cfgs: Sequence[ServerConfig]) -> list[ServerConfig]:
    """Each configuration on buun's build, then its twin on upstream's: interleaved, so that a
    drift of the machine over the run (clocks, heat) touches both builds alike. A tree sweep's
    configuration has no twin (`without_twin`)."""
    alone = without_twin(cfgs)
    return [c for cfg in cfgs for c in (cfg, *([] if cfg in alone else [on_upstream(cfg)]))]


def without_twin(cfgs: Sequence[ServerConfig]) -> list[ServerConfig]:
    """The configurations upstream's build cannot run: the tree sweep's (upstream has no tree
    verification) and those of several slots (upstream's drafter aborts past four at -ub 64, and
    a slot's rollback can lose its state: patches 0011 and 0024)."""
    return [c for c in cfgs if c.tree_budget is not None or c.concurrency > 1]


def common(ctx: int = DEFAULT_CTX, draft_max: int | None = None, host_sampling: bool = False,
           server_args: Sequence[str] = ()) -> Overrides:
    """The bench command line's changes, for every configuration."""
    sets: list[Flag] = [("-c", str(ctx))]
    if draft_max is not None:
        sets.append(("--draft-max", str(draft_max)))
    given = command.parse_args(list(server_args))
    secret = [name for name, _ in given if command.canonical(name) in command.SECRET_FLAGS]
    if secret:  # bench.json records the overrides, and the bench's servers would not get them anyway
        raise UsageError(f"--server-args: {', '.join(secret)} takes a secret, which the bench would write into "
                         "bench.json", "leave it out: the bench's servers are its own, on loopback, with models "
                         "from files (no API key or Hub token needed)")
    return Overrides(tuple(sets + given), ("--backend-sampling",) if host_sampling else ())


@dataclass(frozen=True)
class Models:
    target: Path
    drafter: Path | None


@dataclass(frozen=True)
class Workers:
    """RPC workers every server splits the target over (`buun bench --rpc`), and the drafter's
    device among theirs and this host's, as `buun serve --rpc` places it (spec.with_workers)."""

    endpoints: tuple[addresses.Endpoint, ...]
    draft_device: str | None


def launch(recipe: recipes.Recipe, cfg: ServerConfig, models: Models, binary: Path, port: int,
           overrides: Overrides, models_dir: Path, where: devices.Placement | None = None,
           workers: Workers | None = None, tuned: Tuned | None = None) -> Launch:
    """The exact launch of one configuration: `buun serve`'s for the recipe with `overrides`
    then the configuration's own (an AR server without -md), rendered as serve renders it. Secrets
    the recipe gives (an API key) are left out: the server is the bench's own, on loopback."""
    resolved = settings_of(recipe, cfg, overrides, models_dir, where, workers, tuned)
    if cfg.spec and models.drafter is None:
        raise UsageError(f"the {cfg.label} configuration needs a drafter GGUF", "pass --drafter D.gguf")
    target, drafter = (str(Path(m).expanduser().resolve()) if m else None for m in (models.target, models.drafter))
    assert target is not None
    return resolved.render(binary, target, drafter if cfg.spec else None, spec.DEFAULT_HOST, port, alias=recipe.name)


def argv(recipe: recipes.Recipe, cfg: ServerConfig, models: Models, binary: Path, port: int,
         overrides: Overrides, models_dir: Path, where: devices.Placement | None = None,
         workers: Workers | None = None) -> list[str]:
    """launch's argv alone."""
    return launch(recipe, cfg, models, binary, port, overrides, models_dir, where, workers).argv


def settings_of(recipe: recipes.Recipe, cfg: ServerConfig, overrides: Overrides, models_dir: Path,
                where: devices.Placement | None = None, workers: Workers | None = None,
                tuned: Tuned | None = None) -> ServerSettings:
    """The llama-server settings of one configuration, as `buun serve` resolves them (settings.resolve),
    split over the cards `where` names or over the RPC `workers` as serve splits them; a DFlash
    configuration under the fresh tune of these models (`tuned`: the bench's command line and the
    configuration's own overrides win over it, as serve's command line does)."""
    sets, drops = overrides.then(cfg.overrides).serve_args(command.recipe_flags(recipe.server_flags))
    resolved = settings.resolve(recipe, sets, drops, "the bench's overrides", models_dir, where=where,
                                workers=list(workers.endpoints) if workers else None,
                                tuned=tuned if cfg.spec else None)
    if workers is None or not cfg.spec:
        return resolved
    return resolved.with_flags(settings.with_draft_device(resolved.flags, workers.draft_device))
