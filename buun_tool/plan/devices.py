"""The cards of this host a server runs on (`buun serve --gpus 0,1 [--draft-gpu 1]`, a recipe's
`server.gpus`) and what llama-server gets for them.

nvidia-smi numbers the cards by PCI bus; CUDA, unless told, fastest first. So llama-server gets
CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES=<the list>: the indices are nvidia-smi's, the
other cards are hidden, and the listed ones are CUDA0, CUDA1, ... in the order given. One card
needs nothing more. Several get the target split by layers (`-sm layer -ts <split.plan's layer
counts> -dev CUDA0,...`) and the drafter on one of them (`-devd CUDA<k>`), by default the last,
which holds the target's last layers and its output (the lm_head the drafter borrows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, console, nvidia
from buun_tool.base.command import Flag
from buun_tool.base.errors import UsageError
from buun_tool.formats import recipes
from buun_tool.pipeline import build, patches
from buun_tool.plan import fit, split

ORDER_ENV = "CUDA_DEVICE_ORDER"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
# the flags that place the model (canonical spellings): buun sets them for several cards
SPLIT_FLAGS = ("-sm", "-ts", "-dev", "-devd")
UNKNOWN_GIB = 24.0  # a card's memory when nvidia-smi is not there to say (--print-cmd elsewhere)


def parse_gpus(value: str, option: str = "--gpus") -> tuple[int, ...]:
    """`0,1` -> (0, 1): nvidia-smi indices, each once."""
    items = [v.strip() for v in value.split(",")]
    if not items or not all(command.is_count(v) for v in items):
        raise UsageError(f"{option} {value}: expected nvidia-smi card indices separated by commas",
                         "for example --gpus 0,1 (`nvidia-smi -L` lists the cards)")
    gpus = tuple(int(v) for v in items)
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise UsageError(f"{option} {value}: card {', '.join(map(str, twice))} is listed twice",
                         "list each card once, such as --gpus 0,1")
    return gpus


@dataclass(frozen=True)
class Placement:
    """The cards, in -dev order, and the drafter's."""

    gpus: tuple[int, ...]  # nvidia-smi indices
    draft_gpu: int  # nvidia-smi index, one of gpus
    cards: tuple[nvidia.Gpu, ...]  # nvidia-smi's description of each; () without nvidia-smi

    @property
    def draft_position(self) -> int:
        return self.gpus.index(self.draft_gpu)

    @property
    def env(self) -> dict[str, str]:
        return {ORDER_ENV: "PCI_BUS_ID", VISIBLE_ENV: ",".join(map(str, self.gpus))}

    def split_cards(self) -> list[split.Card]:
        if self.cards:
            return [split.Card.of(g) for g in self.cards]
        return [split.Card(UNKNOWN_GIB, i) for i in self.gpus]


def placement(recipe: recipes.Recipe, gpus: Sequence[int] | None, draft_gpu: int | None, binary: Path,
              detected: Sequence[nvidia.Gpu] | None = None) -> Placement | None:
    """The cards `--gpus` (else the recipe's server.gpus) names, checked against nvidia-smi and the
    build; None when neither names any (llama-server sees the cards as CUDA finds them)."""
    source = "--gpus" if gpus else "server.gpus"
    chosen = tuple(gpus or recipe.gpus)
    if not chosen:
        if draft_gpu is not None:
            raise UsageError(f"--draft-gpu {draft_gpu} needs the cards of the split",
                             f"pass --gpus too, such as --gpus 0,{draft_gpu}" if draft_gpu else "pass --gpus too")
        return None
    shown = ",".join(map(str, chosen))
    if len(set(chosen)) != len(chosen):
        parse_gpus(shown, source)  # says which card is listed twice
    if build.variant_of(binary) == "cpu":
        raise UsageError(f"{source} {shown}: {binary} is a CPU build, which runs on no card",
                         "build for the cards with `buun build --cuda` on this machine, or leave out --gpus")
    detected = nvidia.detect_gpus() if detected is None else detected
    by_index = {g.index: g for g in detected}
    missing = [i for i in chosen if detected and i not in by_index]
    if missing:
        here = ", ".join(f"{g.index} ({g.name})" for g in detected)
        raise UsageError(f"{source} {shown}: nvidia-smi lists no card {', '.join(map(str, missing))} "
                         f"(cards here: {here})", "pass the indices `nvidia-smi -L` shows")
    draft = chosen[-1] if draft_gpu is None else draft_gpu
    if draft not in chosen:
        raise UsageError(f"--draft-gpu {draft}: not one of the cards the server runs on ({source} {shown})",
                         f"pass one of {shown}, or add card {draft} to --gpus")
    return Placement(chosen, draft, tuple(by_index[i] for i in chosen) if detected else ())


def with_split(recipe: recipes.Recipe, flags: list[Flag], where: Placement, ctx: int, models_dir: Path
               ) -> tuple[list[Flag], dict[str, Any]]:
    """The flags that split the target over several cards (split.plan at context `ctx`) and put
    the drafter on its card; a -sm, -ts, -dev or -devd already among the flags (after `--` or in
    the recipe) is kept, with a warning. Also the placement as `buun status` shows it."""
    n = len(where.gpus)
    info: dict[str, Any] = {"gpus": list(where.gpus), "draft_gpu": where.draft_gpu, "env": where.env,
                            "cards": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib,
                                       "compute_cap": g.compute_cap} for g in where.cards],
                            "split": None, "kept": []}
    if n == 1:
        return flags, info
    given = {command.canonical(name): value for name, value in flags}
    kept = [name for name in SPLIT_FLAGS if name in given]
    f = replace(fit.flags_from_server_flags({name: True if v is None else v for name, v in flags}),
                ctx=ctx, rollback=patches.rollback_from_env())
    if command.option(dict(flags), "--spec-type") is None:
        f = replace(f, draft_max=0)
    weights = fit.default_weights(recipe, models_dir)
    plan = split.plan(recipe, f, where.split_cards(), where.draft_position, weights)
    ours = split_flags(plan)
    if kept:
        shown = " ".join(f"{name} {given[name]}" if given[name] is not None else name for name in kept)
        console.warn(f"--gpus {','.join(map(str, where.gpus))}: keeping {shown} from the flags; buun would pass "
                     + " ".join(f"{name} {value}" for name, value in ours if name in kept))
    if "-ts" in given:  # where the user's proportions put the layers, and whether that fits
        plan = split.plan(recipe, f, where.split_cards(), where.draft_position, weights,
                          proportions=_proportions(given["-ts"], n))
        if where.cards and not plan.fits:
            full = ", ".join(f"GPU{c.card.index} {c.total / fit.GIB:.1f} of {c.card.gib:.1f} GiB"
                             for c in plan.cards if c.free < plan.margin_gib * fit.GIB)
            console.warn(f"-ts {given['-ts']} at -c {ctx} overfills {full}: pass a smaller -c, or leave -ts out")
    info.update(split=plan.to_json(), kept=kept)
    return [*flags, *(flag for flag in ours if flag[0] not in kept)], info


def split_flags(plan: split.Split) -> list[Flag]:
    """`-sm layer -ts <layer counts> -dev CUDA0,...,CUDA<n-1> -devd CUDA<drafter's>`."""
    return [("-sm", "layer"), ("-ts", plan.ts), ("-dev", ",".join(c.device for c in plan.cards)),
            ("-devd", plan.draft.device)]


def _proportions(value: str | None, n: int) -> list[float]:
    try:
        parts = [float(p) for p in (value or "").replace("/", ",").split(",") if p.strip()]
    except ValueError:
        parts = []
    if len(parts) != n:
        raise UsageError(f"-ts {value}: expected {n} proportions, one per card of --gpus",
                         "such as -ts 33,32, or leave -ts out: buun plans the split")
    return parts


def describe(info: dict[str, Any]) -> str:
    """`buun status`'s line: `GPU0, GPU1: layers 0-34 on GPU0, 35-63 + output on GPU1; drafter on GPU1`."""
    names = {c["index"]: c["name"] for c in info.get("cards", [])}
    cards = ", ".join(f"GPU{i}" + (f" ({names[i]})" if names.get(i) else "") for i in info.get("gpus", []))
    plan = info.get("split")
    if not plan:
        return f"{cards} (CUDA_VISIBLE_DEVICES={','.join(map(str, info.get('gpus', [])))})"
    where = ", ".join(f"{c['range']} on GPU{c['index']}" for c in plan["cards"])
    drafter = f"; drafter on GPU{info['draft_gpu']}" if plan.get("draft_gpu") is not None else ""
    kept = f" (as the flags' {', '.join(info['kept'])} say)" if info.get("kept") else ""
    return f"{cards}: layers {where}{drafter}{kept}"
