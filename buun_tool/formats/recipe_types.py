"""A recipe's types: the Recipe itself, the Hub repos it names and the geometry of its checkpoints
(TargetGeometry, DrafterGeometry, one Geometry per scale), and the error its checks raise.

Built by recipe_schema.parse, read by every stage; the checks that make them live in
recipe_reader, recipe_geometry and recipe_schema.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from buun_tool.base.errors import UsageError
from buun_tool.formats.recipe_files import reference


class RecipeError(UsageError):
    pass


@dataclass(frozen=True)
class RepoSpec:
    repo: str
    revision: str = "main"
    files: tuple[str, ...] = ()


# --- geometry ------------------------------------------------------------------------------
# The shapes of the real checkpoints, named as in their HF config.json: `buun synth` writes
# tensors of exactly these shapes and `buun fit` plans memory from them.

FULL = "full"  # the scale of the real checkpoints: geometry.target and geometry.drafter as written
# The real Qwen3.5 special tokens follow eos_token_id in this order; the drafter's mask token
# comes after them (`buun synth` writes its vocabulary so).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TargetGeometry:
    """The qwen35 hyper-parameters, named as in the HF config.json."""

    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    mrope_section: tuple[int, ...]
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    eos_token_id: int

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def n_full_attention(self) -> int:
        return sum(self.is_full_attention(i) for i in range(self.num_hidden_layers))


@dataclass(frozen=True)
class DrafterGeometry:
    """The DFlash drafter's hyper-parameters, named as in its config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    # DFlash2 (all four set, or none: a DFlash drafter): a dynamic depthwise convolution of
    # `conv_kernel_size` taps per `conv_group_size` channels around each sublayer, and a selector
    # that walks the top `selector_top_k` candidates per position through rank-`selector_rank`
    # transition scores
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    sliding_window: int = 0  # the drafter's own attention window (HF `sliding_window`); 0: none

    @property
    def is_dflash2(self) -> bool:
        return self.selector_top_k > 0


# A DFlash2 drafter's keys, all four or none; with the window, the drafter's keys a recipe may leave
# out: they default to 0 (a DFlash drafter without a window).
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
OPTIONAL_DRAFTER_KEYS = frozenset((*DFLASH2_KEYS, "sliding_window"))


@dataclass(frozen=True)
class Geometry:
    """The target and drafter of one scale."""

    target: TargetGeometry
    drafter: DrafterGeometry

    def to_json(self) -> dict[str, dict[str, Any]]:
        # optional keys left unset are left out: a DFlash pair's digests stay what they were
        drafter = {k: v for k, v in asdict(self.drafter).items() if v or k not in OPTIONAL_DRAFTER_KEYS}
        return {"target": asdict(self.target), "drafter": drafter}


GEOMETRY_ROLES: dict[str, type] = {"target": TargetGeometry, "drafter": DrafterGeometry}
GEOMETRY_KEYS = {role: frozenset(f.name for f in fields(cls)) for role, cls in GEOMETRY_ROLES.items()}


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    source: Path
    target: RepoSpec  # files = (the target GGUF,)
    drafter: RepoSpec
    tokenizer: RepoSpec
    target_config: str  # the target's config.json, fetched from the tokenizer repo
    quantize: str
    expect: dict[str, Any]
    geometry: dict[str, Geometry]  # by scale: "full" (the real checkpoints) and the recipe's shrinks
    server_flags: dict[str, Any] = field(default_factory=dict)
    tree_budget: int = 0  # server.tree.budget: draft nodes a DDTree step verifies; 0 or 1, the chain
    tree_k: int = 8  # server.tree.k: candidates per draft depth
    slots: int = 1  # server.slots: requests served at once (llama-server's -np)
    gpus: tuple[int, ...] = ()  # server.gpus: nvidia-smi indices of the cards to run on; () = as CUDA finds them

    @property
    def target_gguf(self) -> str:
        return self.target.files[0]

    @property
    def ref(self) -> str:
        """How a command names this recipe, for the hints (`buun pull REF`): see reference."""
        return reference(self.source)

    def repos(self) -> dict[str, RepoSpec]:
        """The Hub repos to pull, by role. The tokenizer repo also gives the target config."""
        tok = RepoSpec(self.tokenizer.repo, self.tokenizer.revision,
                       self.tokenizer.files + (self.target_config,))
        return {"target": self.target, "drafter": self.drafter, "tokenizer": tok}

    def geometry_at(self, scale: str) -> Geometry:
        """Target and drafter geometry at 'full' scale or a shrunk one ('tiny') of the same structure."""
        if scale not in self.geometry:
            raise RecipeError(f"{self.source}: geometry.{scale}: no such scale",
                              f"valid: {', '.join(self.geometry)}")
        return self.geometry[scale]

