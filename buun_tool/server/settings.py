"""One llama-server's settings, resolved once and rendered once. Every server buun runs for a
recipe is planned here: `buun serve`, `start`, `restart` and `service install` (through the launch
spec), setup and its dry-run, each `buun bench` configuration and `buun fit --measure`.

    resolve(recipe, overrides, drops, source, models_dir, ...) -> ServerSettings
    settings.plan                     -> fit.FitFlags: context, slots, KV types, batches, draft, tree
    settings.render(binary, target, draft, host, port, alias) -> Launch(argv, env)
    launch.display(api_key)           -> the command a user could paste, secrets masked

The recipe's flags, the command line's changes (`-- FLAGS`, `--drop`, --tree-budget, --slots,
--gpus, --rpc) and the planner's decisions (the context that fits, the ubatch that holds every
slot's verify, the split over cards) are applied in that order; secrets are held apart from the
flags and reach llama-server through its environment (child_env), never its argv.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, console
from buun_tool.base import tree_budget as budgets
from buun_tool.base.command import Flag
from buun_tool.base.errors import UsageError
from buun_tool.formats import recipes
from buun_tool.plan import context, devices, fit
from buun_tool.server import addresses
from buun_tool.server.tuned import DRAFT_OPTIONS, Tuned

API_KEY_ENV = "BUUN_API_KEY"  # where buun itself takes the key from (besides --api-key)


@dataclass(frozen=True)
class Launch:
    """A rendered launch: llama-server's argv and the variables of its own (the cards: devices.py,
    a patch's switch), which child_env adds to this process's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def display(self, api_key: str | None = None) -> str:
        """The command a user could paste, secrets masked, after the variables it needs."""
        return command.display(self.argv, api_key, self.env)

    def environ(self, api_key: str | None = None) -> dict[str, str]:
        return child_env(api_key, self.env)


@dataclass(frozen=True)
class ServerSettings:
    """One llama-server's settings: `flags` as llama-server gets them, in order, no secret among
    them; `plan` the same settings typed. The secrets (canonical flag -> value) go to llama-server's
    environment (command.SECRET_ENV)."""

    flags: list[Flag]
    context: context.ContextChoice | None = None  # the -c among the flags, and why
    secrets: dict[str, str] = field(default_factory=dict)
    recipe_flags: list[str] = field(default_factory=list)  # the recipe's flag names kept as it wrote them
    env: dict[str, str] = field(default_factory=dict)  # for llama-server's environment: the cards (devices.py)
    placement: dict[str, Any] | None = None  # the cards and the split (devices.with_split)
    tuned: str | None = None  # the tune's setting and where it came from (server/tuned.py), when applied
    drafter: bool = True  # False: a tune found AR faster on this card, and the server runs no drafter

    @property
    def plan(self) -> fit.FitFlags:
        return plan_of(self.flags)

    def with_flags(self, flags: list[Flag]) -> ServerSettings:
        return replace(self, flags=list(flags))

    def render(self, binary: str | Path, target: str | Path, draft: str | Path | None, host: str, port: int,
               alias: str | None = None) -> Launch:
        """The launch: models first (no -md without a drafter), the flags, the model's name, the
        address (command.server_argv); and the launch's own variables."""
        draft = draft if self.drafter else None
        argv = command.server_argv(str(binary), str(target), None if draft is None else str(draft), host, port,
                                   self.flags, alias=alias)
        return Launch(argv, dict(self.env))


def plan_of(flags: list[Flag]) -> fit.FitFlags:
    """The settings of `flags` that decide memory and speed, typed: context, slots, KV types,
    batches, the draft (n_max 0 without a drafter: an AR server verifies a token a slot) and the
    tree budget."""
    given = {name: True if v is None else v for name, v in flags}
    f = fit.flags_from_server_flags(given)
    return f if command.option(given, "--spec-type") is not None else replace(f, draft_max=0)


CPU_LAYERS = ("-ngl", "-ngld")  # the target's and the drafter's layers on a card: none for a CPU build


def resolve(recipe: recipes.Recipe, overrides: list[Flag], drops: list[str], source: str,
            models_dir: Path, tree_budget: int | None = None, slots: int | None = None,
            where: devices.Placement | None = None, workers: list[addresses.Endpoint] | None = None,
            cpu_build: bool = False, tuned: Tuned | None = None) -> ServerSettings:
    """The settings of every server buun runs for a recipe, `buun serve`'s and each `buun bench`
    configuration's: the recipe's, then the fresh tune's choice (`tuned`, with_tuned), with `overrides` in the
    place of the recipe's flag of the same option (or added) and `drops` left out, secrets taken out, the tree's
    flags settled (with_tree; a dropped --spec-tree-budget is the chain), the slots' (with_slots), -c decided
    (with_context, weighing the models in `models_dir`) and, on the cards `where` names, the split
    (devices.with_split). `workers` come first, as `--rpc`: llama-server must know them before it reads a device
    name (-dev, -devd). A `cpu_build` llama-server gets buun's default -c, not what fits the card nvidia-smi
    lists, and, without workers, `-ngl 0 -ngld 0` (there is no card to offload the recipe's layers to) unless
    the overrides say otherwise. `source` names where the overrides came from, for the error of a flag buun sets
    itself."""
    base = command.recipe_flags(recipe.server_flags)
    command.check_unmanaged(base, f"the recipe {recipe.source}")
    command.check_unmanaged(overrides, source)
    command.check_drops(drops)
    base, tuned_drops, tree_budget, note = with_tuned(base, overrides, tree_budget, tuned)
    drops = [*drops, *tuned_drops]
    if cpu_build and not workers:  # as `buun setup --cpu` plans it: no layer to a card
        given = {command.canonical(n) for n, _ in overrides} | set(tuned_drops)
        overrides = [*((flag, "0") for flag in CPU_LAYERS if flag not in given), *overrides]
    # the recipe's secrets and the command line's alike (an override replaces the recipe's)
    flags, secrets = command.take_secrets(command.merge(base, overrides, drops))
    if workers:
        flags = [("--rpc", addresses.join(workers)), *flags]
    if command.TREE_BUDGET in {command.canonical(d) for d in drops}:
        tree_budget = 0  # no tree flag, not even the recipe's server.tree
    flags = with_tree(recipe, flags, overrides, tree_budget)
    flags = with_slots(recipe, flags, overrides, slots)
    flags, context = with_context(recipe, flags, overrides, models_dir, where, cpu_build)
    drafter = not tuned_drops
    if where is None:
        return ServerSettings(flags, context, secrets, _kept(base, overrides), tuned=note, drafter=drafter)
    flags, placed = devices.with_split(recipe, flags, where, context.value, models_dir)
    return ServerSettings(flags, context, secrets, _kept(base, overrides), where.env, placed, note, drafter)


def with_tuned(base: list[Flag], overrides: list[Flag], tree_budget: int | None, tuned: Tuned | None
               ) -> tuple[list[Flag], list[str], int | None, str | None]:
    """The recipe's flags under a tune's choice, and the flags to drop, the tree budget and the
    note that says where the setting came from. The command line wins: a --tree-budget or a
    --draft-max it gives replaces the tune's, and any drafter option it gives serves DFlash over a
    tune that picked AR."""
    if tuned is None:
        return base, [], tree_budget, None
    given = {command.canonical(n) for n, _ in overrides}
    choice = tuned.choice
    if choice.kind == "ar":
        if tree_budget is not None or given & set(DRAFT_OPTIONS):
            return base, [], tree_budget, f"{tuned.note}: not applied, the command line sets the drafter"
        return base, list(DRAFT_OPTIONS), 0, tuned.note
    overridden = tree_budget is not None or command.TREE_BUDGET in given or (
        "--draft-max" in given and choice.draft_max is not None)
    if tree_budget is None and command.TREE_BUDGET not in given:
        tree_budget = choice.tree_budget
    note = tuned.note + ("; the command line overrides part of it" if overridden else "")
    return command.merge(base, choice.flags()), [], tree_budget, note


def with_draft_device(flags: list[Flag], device: str | None) -> list[Flag]:
    """The flags with `-devd device` (with_workers' choice) unless they name the drafter's device."""
    if device and not command.option(dict(flags), "-devd"):
        return [*flags, ("-devd", device)]
    return flags


def with_context(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], models_dir: Path,
                 where: devices.Placement | None = None, cpu_build: bool = False
                 ) -> tuple[list[Flag], context.ContextChoice]:
    """The flags with -c decided (context.choose_context): the command line's, the recipe's pinned
    number, or the largest that fits the GPU here (the cards `where` names: split by layers over
    several; weighing the models in `models_dir`); in the recipe's place, or added."""
    cards = None if where is None else list(where.cards)  # no nvidia-smi: no card to fit
    choice = context.choose_context(recipe, {n: True if v is None else v for n, v in flags},
                                from_command_line=any(command.canonical(n) == "-c" for n, _ in overrides),
                                models_dir=models_dir, gpus=cards,
                                draft=None if where is None else where.draft_position, cpu_build=cpu_build)
    return _set_flag(flags, "-c", choice.value), choice


def with_tree(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], budget: int | None) -> list[Flag]:
    """The flags with the tree's settings (patch 0023). The budget is --tree-budget's, else one among
    the flags (after `--` or in the recipe's server.flags, in any spelling), else the recipe's
    server.tree.budget. A tree (budget 2 or more) gets --spec-tree-budget N, and the recipe's
    --spec-tree-k unless the flags give one; the chain gets no tree flag: it is llama-server's
    default, so a build without 0023 serves it. A tree that does not fit one ubatch is refused here
    rather than by llama-server's assert."""
    if budget is not None and any(command.canonical(n) == command.TREE_BUDGET for n, _ in overrides):
        raise UsageError("--tree-budget and a --spec-tree-budget after `--` both set the tree budget",
                         "give one of them")
    given = [v for n, v in flags if command.canonical(n) == command.TREE_BUDGET]
    if budget is None and given:
        budget = budgets.parse(given[-1], command.TREE_BUDGET)
    n = budgets.check(recipe.tree_budget if budget is None else budget, "--tree-budget")
    out = [f for f in flags if command.canonical(f[0]) != command.TREE_BUDGET]
    if budgets.is_tree(n):
        out.append((command.TREE_BUDGET, str(n)))
        if not any(command.canonical(name) == command.TREE_K for name, _ in out):
            out.append((command.TREE_K, str(recipe.tree_k)))
    fit.check_tree(fit.flags_from_server_flags({name: True if v is None else v for name, v in out}))
    return out


def with_slots(recipe: recipes.Recipe, flags: list[Flag], overrides: list[Flag], slots: int | None) -> list[Flag]:
    """The flags with the slots' settings: -np N, N being --slots, else a -np among the flags (after
    `--` or in the recipe's server.flags), else the recipe's server.slots; and -ub and -b raised,
    where the recipe's are smaller, to hold every slot's verify in one ubatch (fit.with_slots), so
    that the slots verify in one target forward. A -ub or -b after `--` is kept as given, with a
    warning when it splits the slots' verify."""
    if slots is not None and any(command.canonical(n) == "-np" for n, _ in overrides):
        raise UsageError("--slots and a -np after `--` both set the number of slots", "give one of them")
    given = [v for n, v in flags if command.canonical(n) == "-np"]
    n = slots if slots is not None else _slots_flag(given[-1]) if given else recipe.slots
    current = plan_of(flags)
    planned = fit.with_slots(recipe, current, n)
    out = [f for f in flags if command.canonical(f[0]) != "-np"] + [("-np", str(n))]
    if planned.ubatch <= min(current.ubatch, current.batch):
        return out
    mine = {command.canonical(name) for name, _ in overrides} & {"-ub", "-b"}
    if mine:
        console.warn(f"{n} slots verify {planned.ubatch} tokens a step, more than -ub {current.ubatch} "
                     f"(-b {current.batch}): the slots verify in more than one target forward "
                     f"(`-- -ub {planned.ubatch} -b {planned.batch}` holds them all)")
        return out
    return _set_flag(_set_flag(out, "-ub", planned.ubatch), "-b", planned.batch)


def _set_flag(flags: list[Flag], canonical_name: str, value: int) -> list[Flag]:
    """The flags with that option's value replaced in its place, or added."""
    at = next((i for i, (n, _) in enumerate(flags) if command.canonical(n) == canonical_name), None)
    if at is None:
        return [*flags, (canonical_name, str(value))]
    return [*flags[:at], (flags[at][0], str(value)), *flags[at + 1:]]


def _slots_flag(value: str | None) -> int:
    if value is None or not command.is_count(value):
        shown = "-np" + (f" {value}" if value is not None else " without a value")
        raise UsageError(f"{shown}: expected a number of slots", f"1 to {recipes.MAX_SLOTS}; `buun serve --slots N`")
    return int(value)


def _kept(base: list[Flag], overrides: list[Flag]) -> list[str]:
    """The recipe's flags that reach llama-server as the recipe wrote them (for error hints)."""
    over = {command.canonical(n) for n, _ in overrides}
    return [n for n, _ in base if command.canonical(n) not in over]


def child_env(api_key: str | None, own: dict[str, str] | None = None) -> dict[str, str]:
    """llama-server's environment: ours, with the launch's own variables (`own`: the cards) and the
    key in its own variable (never in argv)."""
    env = {k: v for k, v in os.environ.items() if k not in (command.API_KEY_ENV, API_KEY_ENV)}
    env.update(own or {})
    if api_key:
        env[command.API_KEY_ENV] = api_key
    return env
