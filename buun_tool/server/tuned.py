"""The tuned overlay: the configuration `buun tune` measured fastest on this card, with its evidence,
applied to every server of the recipe between the recipe's flags and the command line's.

    key_for(recipe, cards, binary, target, drafter) -> Key     what a tune is valid for
    lookup(key) -> Found(tuned, stale)                          the recipe's tune on this card, fresh or not
    save(tuned), clear(recipe)                                  state_dir()/tuned/<recipe>/<card>.json
    tuned.note -> "tree budget 22 (tuned on NVIDIA GeForce RTX 3090, 2026-12-01: 1.07x the chain, 4.1x AR)"

A tune is keyed by the recipe, the card model, the build (a hash of its stamp: pin, patched source,
flags, compiler) and the two models (a fingerprint of each file). When any of them changes the
tune is stale: it is no longer applied, and `buun status` and `buun doctor` say which part changed
and name the command. One tune a recipe and card model: a machine with two kinds of card keeps one
for each.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from buun_tool.base import command, fsutil, nvidia, paths
from buun_tool.base.command import Flag
from buun_tool.plan import devices

CPU = "CPU"  # the card of a CPU build
STAMP = "buun-build.json"  # the build's stamp beside its bin folder (pipeline/build.py's STAMP)
FINGERPRINT_BYTES = 4 << 20  # read from each end of a model file (its header and its last tensors)

KINDS = ("ar", "chain", "tree")


@dataclass(frozen=True)
class Key:
    recipe: str
    card: str  # nvidia-smi's name of the card(s), or CPU
    build: str  # build_id of the llama-server
    target: str  # fingerprint of each model file
    drafter: str

    def changed(self, now: Key) -> list[str]:
        """What differs from `now`, in words ("the build", "the drafter")."""
        names = {"recipe": "the recipe", "card": "the card", "build": "the build", "target": "the target model",
                 "drafter": "the drafter"}
        return [names[k] for k in names if getattr(self, k) != getattr(now, k)]


@dataclass(frozen=True)
class Choice:
    """What a tune picked: AR (no drafter), the chain of `draft_max` tokens, or a tree of `tree_budget`."""

    kind: str
    draft_max: int | None = None
    tree_budget: int = 0

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def name(self) -> str:
        """The configuration's name, as the tune's table and bench.json name it."""
        if self.kind == "ar":
            return "ar"
        return f"dflash-tree{self.tree_budget}" if self.kind == "tree" else f"dflash-chain{self.draft_max}"

    def describe(self) -> str:
        if self.kind == "ar":
            return "AR (no drafter)"
        if self.kind == "tree":
            return f"tree budget {self.tree_budget}"
        return f"chain of {self.draft_max}" if self.draft_max else "the chain"

    def flags(self) -> list[Flag]:
        """The flags it sets over the recipe's (the tree budget goes through settings.with_tree)."""
        return [("--draft-max", str(self.draft_max))] if self.kind != "ar" and self.draft_max else []


@dataclass(frozen=True)
class Tuned:
    key: Key
    choice: Choice
    date: str  # YYYY-MM-DD of the tune
    workload: str
    decode_tps: float  # the pick's decode tok/s on the tune's workload
    vs_ar: float | None = None  # its tok/s over AR's
    vs_chain: float | None = None  # a tree's over the recipe's chain
    reason: str = ""  # why AR, when it is AR
    evidence: str = ""  # the folder with the tune's bench.json, tune.json and report
    seconds: float = 0.0  # how long the tune took
    cut: list[str] = field(default_factory=list)  # configurations the time budget left out

    @property
    def note(self) -> str:
        """The setting and where it came from, for --print-cmd, status and the dry-run."""
        ratios = [f"{self.vs_chain:.2f}x the chain" if self.vs_chain else "",
                  f"{self.vs_ar:.1f}x AR" if self.vs_ar and self.choice.kind != "ar" else ""]
        why = ", ".join(r for r in ratios if r) or self.reason
        return f"{self.choice.describe()} (tuned on {self.key.card}, {self.date}" + (f": {why})" if why else ")")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tuned:
        d = dict(data)
        d["key"] = Key(**d["key"])
        d["choice"] = Choice(**d["choice"])
        return cls(**d)


@dataclass(frozen=True)
class Found:
    tuned: Tuned | None  # the recipe's tune on this card model, fresh or stale
    stale: list[str] = field(default_factory=list)  # what changed since (empty: fresh)

    @property
    def fresh(self) -> Tuned | None:
        return self.tuned if self.tuned is not None and not self.stale else None

    def status(self) -> str:
        """One line for status and doctor."""
        if self.tuned is None:
            return "not tuned on this card: `buun tune` measures the chain, trees and AR here and picks the fastest"
        if self.stale:
            return (f"stale: {' and '.join(self.stale)} changed since the tune of {self.tuned.date}, whose "
                    f"{self.tuned.choice.describe()} is not applied; `buun tune {self.tuned.key.recipe}` measures "
                    "again")
        return self.tuned.note


def card_name(names: list[str]) -> str:
    """The key's card from the names of the cards a server runs on ("2x NVIDIA H200" for two alike)."""
    if not names:
        return CPU
    alike = {n: names.count(n) for n in dict.fromkeys(names)}
    return ", ".join(n if k == 1 else f"{k}x {n}" for n, k in alike.items())


def build_id(binary: Path) -> str:
    """A hash of the build's stamp beside its bin folder (pin, patched source, CMake flags, compiler);
    of the binary's size and time when it has none (a build made elsewhere)."""
    stamp = binary.parent.parent / STAMP
    try:
        text = json.dumps(json.loads(stamp.read_text()), sort_keys=True)
    except (OSError, ValueError):
        try:
            st = binary.stat()
            text = f"{binary.resolve()} {st.st_size} {st.st_mtime_ns}"
        except OSError:
            text = f"{binary} missing"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_FINGERPRINTS: dict[tuple[str, int, int], str] = {}


def fingerprint(path: Path | None) -> str:
    """A model file's identity without reading all of its gigabytes: its size and a hash of its
    first and last FINGERPRINT_BYTES (a GGUF's header names every tensor, its end holds the last
    ones). A file downloaded, converted, quantized or synthesized again differs in them."""
    if path is None:
        return "none"
    try:
        st = path.stat()
    except OSError:
        return "missing"
    if not path.is_file():  # a folder given for a model: the launch's own check names it
        return "not a file"
    cached = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if cached in _FINGERPRINTS:
        return _FINGERPRINTS[cached]
    h = hashlib.sha256(str(st.st_size).encode())
    try:
        with path.open("rb") as f:
            h.update(f.read(FINGERPRINT_BYTES))
            if st.st_size > FINGERPRINT_BYTES:
                f.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
                h.update(f.read(FINGERPRINT_BYTES))
    except OSError:  # unreadable: the launch says so itself
        return "unreadable"
    _FINGERPRINTS[cached] = h.hexdigest()[:16]
    return _FINGERPRINTS[cached]


def key_for(recipe: str, cards: list[str], binary: Path, target: Path, drafter: Path | None) -> Key:
    return Key(recipe, card_name(cards), build_id(binary), fingerprint(target), fingerprint(drafter))


def cards_of(where: devices.Placement | None, cpu_build: bool) -> list[str]:
    """The names of the cards a server runs on: those `where` names, else every card nvidia-smi
    lists (llama-server's own choice); none for a CPU build."""
    if cpu_build:
        return []
    if where is not None and where.cards:
        return [g.name for g in where.cards]
    return [g.name for g in nvidia.detect_gpus()]


def find(recipe: str, where: devices.Placement | None, cpu_build: bool, binary: Path, target: Path,
         drafter: Path | None) -> Found:
    """The recipe's tune for a server of these cards, build and models."""
    return lookup(key_for(recipe, cards_of(where, cpu_build), binary, target, drafter))


def for_launch(launch: dict[str, Any]) -> Found:
    """The tune for a saved launch (spec.json): its recipe, cards, build and models, as they are now."""
    binary = Path(str(launch.get("binary", "")))
    cards = [str(c.get("name")) for c in (launch.get("placement") or {}).get("cards") or []]
    cpu_build = build_variant(binary) == "cpu"
    names = cards if cards and not cpu_build else cards_of(None, cpu_build)
    draft = launch.get("draft")
    return lookup(key_for(str(launch.get("recipe")), names, binary, Path(str(launch.get("target"))),
                          Path(str(draft)) if draft else None))


def build_variant(binary: Path) -> str | None:
    """cpu or cuda, from the stamp beside the binary's bin folder (pipeline/build.py writes it)."""
    try:
        return str(json.loads((binary.parent.parent / STAMP).read_text()).get("variant")) or None
    except (OSError, ValueError, AttributeError):
        return None


def _slug(card: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", card).strip("-") or "card"


def path(recipe: str, card: str) -> Path:
    return paths.tuned_dir() / recipe / f"{_slug(card)}.json"


def load(recipe: str, card: str) -> Tuned | None:
    """The recipe's tune on this card model; None when there is none or its file is unreadable."""
    try:
        return Tuned.from_json(json.loads(path(recipe, card).read_text()))
    except (OSError, ValueError, TypeError, KeyError, AssertionError):
        return None


def lookup(key: Key) -> Found:
    tuned = load(key.recipe, key.card)
    return Found(tuned, tuned.key.changed(key) if tuned else [])


def save(tuned: Tuned) -> Path:
    dest = path(tuned.key.recipe, tuned.key.card)
    fsutil.write_json_atomic(dest, tuned.to_json())
    return dest


def clear(recipe: str) -> list[Path]:
    """Forget the recipe's tunes (every card's); the files removed."""
    folder = paths.tuned_dir() / recipe
    gone = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for f in gone:
        f.unlink()
    return gone


# The options only a server with a drafter takes (canonical spellings): AR leaves them out, and a
# command line that gives one asks for DFlash over a tune that picked AR.
DRAFT_OPTIONS = ("--spec-type", "-cd", "-ngld", "--draft-max", "--draft-min", "--draft-p-min", "-ctkd", "-ctvd",
                 "-td", "-tbd", "-devd", "-otd", command.TREE_BUDGET, command.TREE_K, "--spec-synth-tree")
