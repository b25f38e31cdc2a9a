"""The context (-c) a server gets, and why: the launch's policy over `buun fit`'s planner.

A number on the command line or pinned by the recipe is kept; a recipe's `-c: fit` becomes the
largest context that fits the GPU found at launch (split over several cards with split.py), or
buun's default where nothing is on a GPU (a CPU build, -ngl 0, RPC workers). `buun status`
shows the value and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, nvidia
from buun_tool.base.errors import UsageError
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import patches
from buun_tool.plan import split
from buun_tool.plan.fit import FIT, MARGIN_GIB, FitFlags, cells, default_weights, flags_from_server_flags, max_context


@dataclass(frozen=True)
class ContextChoice:
    """The -c a server gets, and why (`buun status` shows both)."""

    value: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def choose_context(recipe: Recipe, flags: Mapping[str, Any], from_command_line: bool, models_dir: Path,
                   gpus: list[nvidia.Gpu] | None = None, draft: int | None = None,
                   cpu_build: bool = False) -> ContextChoice:
    """-c from the merged llama-server flags: a number given on the command line or pinned by the
    recipe is kept; `fit` (or none) is the largest context `buun fit` finds for the GPU here, with
    the flags' KV types, draft and batch sizes and the models in `models_dir` (as `buun fit
    --models-dir` weighs them); without a GPU (or with -ngl 0, or a `cpu_build` of llama-server,
    which runs on no card whatever nvidia-smi lists), FitFlags' default. With `draft`
    (the drafter's card, a position in `gpus`), several `gpus` are a layer split (split.py)."""
    given = command.option(flags, "-c", FIT)
    if str(given) != FIT:
        if given is True:  # `-- -c` with no number after it
            raise UsageError("-c without a value: expected a number of tokens",
                             "such as `-- -c 16384`, or leave it out for the largest context that fits")
        if not command.is_count(str(given)):
            raise UsageError(f"-c {given}: expected a number of tokens, or `fit` in a recipe")
        return ContextChoice(int(given), "set on the command line" if from_command_line
                             else f"pinned by the recipe ({Path(str(recipe.source)).name})")
    n_slots = flags_from_server_flags(flags).n_parallel
    default = FitFlags().ctx * n_slots  # -c is shared by the slots: buun's default context for each
    each = f" ({FitFlags().ctx} for each of {n_slots} slots)" if n_slots > 1 else ""
    if command.option(flags, "--rpc"):  # the layers go to other machines, whose memory buun does not weigh
        return ContextChoice(default, f"RPC workers hold the model, and `buun fit` weighs one local GPU: buun's "
                             f"default{each}; pass `-- -c N` for more")
    if cpu_build:  # the cache would be in host memory, sized for the card's (its -ngl is 0: settings.resolve)
        return ContextChoice(default, f"a CPU build of llama.cpp, nothing on a GPU: buun's default{each}; "
                             "`buun build --cuda` builds for the card")
    ngl = str(command.option(flags, "-ngl", "99"))
    if ngl == "0":
        return ContextChoice(default, f"-ngl 0, nothing on a GPU: buun's default{each}")
    gpus = nvidia.detect_gpus() if gpus is None else gpus
    if not gpus:
        return ContextChoice(default, f"no GPU found to fit: buun's default{each}")
    gpu, gib = gpus[0], gpus[0].memory_mib / 1024
    fit_flags = replace(flags_from_server_flags(flags), rollback=patches.rollback_from_env())
    weights = default_weights(recipe, models_dir)
    where, command_line = f"the {gpu.name} ({gib:.1f} GiB)", f"`buun fit {recipe.ref}`"
    if draft is not None and len(gpus) > 1:
        cards = [split.Card.of(g) for g in gpus]
        best = split.max_context(recipe, fit_flags, cards, draft, weights, MARGIN_GIB)
        where = f"GPUs {','.join(str(g.index) for g in gpus)} split by layers " \
                f"({' + '.join(f'{c.gib:.1f}' for c in cards)} GiB)"
        command_line = f"`buun fit {recipe.ref} --gpus {','.join(str(g.index) for g in gpus)}`"
    else:
        best = max_context(recipe, fit_flags, gib, MARGIN_GIB, weights=weights)
    if not best:
        return ContextChoice(default, f"no context fits {where} with these flags: "
                             f"buun's default; {command_line} shows what would fit")
    each = f", {cells(best, n_slots) // n_slots} for each of {n_slots} slots" if n_slots > 1 else ""
    return ContextChoice(best, f"the largest that fits {where}, from `buun fit`{each}")

