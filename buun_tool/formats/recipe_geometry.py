"""A recipe's geometry, typed and checked on load: the base (`full`, the real checkpoints) and each
shrink written under geometry (`tiny`), every value named at the key it comes from, and the rules
across fields that llama.cpp and `buun synth` need (recipes/README.md describes them)."""

from __future__ import annotations

from typing import Any, get_type_hints

from buun_tool.formats.recipe_reader import Reader, is_index
from buun_tool.formats.recipe_types import (
    DFLASH2_KEYS,
    FULL,
    GEOMETRY_ROLES,
    OPTIONAL_DRAFTER_KEYS,
    SPECIAL_TOKENS,
    DrafterGeometry,
    Geometry,
    RecipeError,
)


class _GeometryReader:
    """One scale's values, each read and named at the dotted key it comes from: the scale's own
    override (`geometry.tiny.target.hidden_size`) or the base it inherits (`geometry.target...`)."""

    def __init__(self, r: Reader, scale: str):
        self.r, self.scale = r, scale
        self.overrides = r.data["geometry"].get(scale, {}) if scale != FULL else {}

    def key(self, role: str, name: str) -> str:
        if name in (self.overrides.get(role) or {}):
            return f"geometry.{self.scale}.{role}.{name}"
        return f"geometry.{role}.{name}"

    def given(self, role: str, name: str) -> bool:
        return name in (self.overrides.get(role) or {}) or name in (self.r.data["geometry"].get(role) or {})

    def value(self, role: str, name: str, kind: Any) -> Any:
        dotted = self.key(role, name)
        if role == "drafter" and name in OPTIONAL_DRAFTER_KEYS and not self.given(role, name):
            return 0
        if kind is int:
            v = self.r.get(dotted, int)
            if v <= 0:
                raise self.r.fail(dotted, "a positive integer", v)
        elif kind is float:
            v = self.r.get(dotted, float)
            if v <= 0:
                raise self.r.fail(dotted, "a positive number", v)
        else:  # tuple[int, ...]: layer ids, rope sections
            v = self.r.get(dotted, list)
            if not v or not all(map(is_index, v)):
                raise self.r.fail(dotted, "a list of integers >= 0", v)
            v = tuple(v)
        return v

    def build(self) -> Geometry:
        parts = {role: cls(**{name: self.value(role, name, kind) for name, kind in get_type_hints(cls).items()})
                 for role, cls in GEOMETRY_ROLES.items()}
        geo = Geometry(parts["target"], parts["drafter"])
        problems = _geometry_problems(geo, self.key)
        if problems:
            at = f" (scale {self.scale})" if self.scale != FULL else ""
            raise RecipeError(f"{self.r.source}: " + "; ".join(problems) + at,
                              "the geometry's rules are described in recipes/README.md")
        return geo


def _geometry_problems(g: Geometry, key: Any) -> list[str]:
    """What llama.cpp (and `buun synth`'s vocabulary) need across fields, each named by its key."""
    t, d = g.target, g.drafter
    rules = (
        ("drafter", "hidden_size", d.hidden_size, d.hidden_size == t.hidden_size,
         f"{key('target', 'hidden_size')} ({t.hidden_size}): llama.cpp feeds the target's hidden states "
         "to the drafter's fc"),
        ("target", "linear_value_head_dim", t.linear_value_head_dim, t.linear_value_head_dim == t.linear_key_head_dim,
         f"{key('target', 'linear_key_head_dim')} ({t.linear_key_head_dim}): qwen35 has one ssm.state_size"),
        ("target", "linear_num_value_heads", t.linear_num_value_heads,
         t.linear_num_value_heads % t.linear_num_key_heads == 0,
         f"a multiple of {key('target', 'linear_num_key_heads')} ({t.linear_num_key_heads})"),
        ("target", "mrope_section", list(t.mrope_section), 2 * sum(t.mrope_section) == t.n_rot,
         f"sections summing to head_dim * partial_rotary_factor / 2 ({t.n_rot / 2:g})"),
        ("drafter", "target_layer_ids", list(d.target_layer_ids), max(d.target_layer_ids) + 1 < t.num_hidden_layers,
         f"layer indices in [0, {t.num_hidden_layers - 1}): the drafter reads layer inputs, so the last of "
         f"{key('target', 'num_hidden_layers')} ({t.num_hidden_layers}) is left out"),
        ("drafter", "mask_token_id", d.mask_token_id,
         t.eos_token_id + len(SPECIAL_TOKENS) <= d.mask_token_id < t.vocab_size,
         f"an id in [{t.eos_token_id + len(SPECIAL_TOKENS)}, {t.vocab_size}): after the target's "
         f"{len(SPECIAL_TOKENS)} special tokens from {key('target', 'eos_token_id')} and inside "
         f"{key('target', 'vocab_size')}"),
    )
    problems = [f"{key(role, name)}: expected {expected}, got {got!r}"
                for role, name, got, ok, expected in rules if not ok]
    return problems + _dflash2_problems(d, key)


def _dflash2_problems(d: DrafterGeometry, key: Any) -> list[str]:
    """A DFlash2 drafter's rules (pinned llama.cpp, src/models/dflash.cpp's loader): the four keys
    together, channels in whole groups, and the selector's lattice (top_k candidates and top_k^2
    transition scores a position) inside one hidden row."""
    given = [n for n in DFLASH2_KEYS if getattr(d, n)]
    if not given:
        return []
    if len(given) < len(DFLASH2_KEYS):
        missing = ", ".join(key("drafter", n) for n in DFLASH2_KEYS if n not in given)
        return [f"{missing}: expected with {', '.join(key('drafter', n) for n in given)} (a DFlash2 drafter "
                "has all four)"]
    problems = []
    if d.hidden_size % d.conv_group_size:
        problems.append(f"{key('drafter', 'conv_group_size')}: expected a divisor of "
                        f"{key('drafter', 'hidden_size')} ({d.hidden_size}), got {d.conv_group_size}")
    if d.selector_top_k * (d.selector_top_k + 1) > d.hidden_size:
        problems.append(f"{key('drafter', 'selector_top_k')}: expected top_k * (top_k + 1) <= "
                        f"{key('drafter', 'hidden_size')} ({d.hidden_size}): the selector packs its lattice "
                        f"into one hidden row, got {d.selector_top_k}")
    return problems


def validate_geometry(r: Reader) -> dict[str, Geometry]:
    """Every scale typed and checked: the base (`full`) and each shrink written under geometry."""
    r.get("geometry", dict)
    scales = [FULL, *(k for k in r.data["geometry"] if k not in GEOMETRY_ROLES)]
    return {scale: _GeometryReader(r, scale).build() for scale in scales}
