"""The weights' part of a launch's GPU memory: every tensor but token_embd, which llama.cpp keeps
in host memory; the drafter borrows the target's embeddings and lm_head. From the GGUFs when
present, else from the recipe geometry and the quant types (the exact tensor list `buun synth`
writes). The target's are also given by block, for a layer split (split.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from buun_tool.formats import gguf_tools, layout, model_plan
from buun_tool.formats.recipes import Recipe


@dataclass(frozen=True)
class Weights:
    target_gpu: int
    target_host: int  # token_embd stays in host memory
    drafter_gpu: int
    source: str
    # the target's GPU bytes by block (blk.N.*, as many as the GGUF's block_count) and of the output
    # layer (output.weight, output_norm): what a layer split (split.py) puts on each card
    layers: tuple[int, ...] = ()
    output: int = 0


def _split(tensors: list[tuple[str, int]]) -> tuple[int, int]:
    host = sum(n for name, n in tensors if name == "token_embd.weight")
    return sum(n for _, n in tensors) - host, host


_BLOCK = re.compile(r"blk\.(\d+)\.")


def _by_layer(tensors: list[tuple[str, int]]) -> tuple[tuple[int, ...], int]:
    """(bytes of each block, bytes of the rest but token_embd: the output layer)."""
    blocks: dict[int, int] = {}
    output = 0
    for name, n in tensors:
        m = _BLOCK.match(name)
        if m:
            blocks[int(m.group(1))] = blocks.get(int(m.group(1)), 0) + n
        elif name != "token_embd.weight":
            output += n
    return tuple(blocks.get(i, 0) for i in range(max(blocks, default=-1) + 1)), output


def _target_weights(tensors: list[tuple[str, int]], drafter_gpu: int, source: str) -> Weights:
    tgpu, thost = _split(tensors)
    layers, output = _by_layer(tensors)
    return Weights(tgpu, thost, drafter_gpu, source, layers, output)


def weights_from_plan(recipe: Recipe, scale: str, target_type: str, draft_type: str) -> Weights:
    pair = model_plan.plan_pair(recipe, scale, target_type, draft_type)
    dgpu, _ = _split([(t.name, t.nbytes) for t in pair.drafter.tensors])
    return _target_weights([(t.name, t.nbytes) for t in pair.target.tensors], dgpu,
                           f"geometry ({scale}) x {target_type} / {draft_type}")


def _gguf_tensors(path: Path) -> list[tuple[str, int]]:
    st = path.stat()
    return list(_read_tensors(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _read_tensors(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    """A GGUF's tensors, read once per file as it is. buun's own reader checks the header (a file
    from the Hub is anyone's: gguf-py's reader raised bare ValueErrors, or hung on a nested
    array) and skips the vocabulary, which gguf-py parses whole (seconds)."""
    del size, mtime_ns  # the cache key: a changed file is read again
    with gguf_tools.GgufFile(Path(path)) as f:
        return tuple((t.name, t.nbytes) for t in f.tensors)


def default_weights(recipe: Recipe, models_dir: Path, target_type: str | None = None,
                    draft_type: str = "q4_k") -> Weights:
    """The pulled GGUFs' tensors when both are in `models_dir`, else the recipe geometry at its quant."""

    lay = layout.for_recipe(recipe, models_dir)
    drafter = lay.drafter_gguf()
    if target_type is None and lay.target_gguf.is_file() and drafter.is_file():
        return weights_from_files(lay.target_gguf, drafter)
    quant = (target_type or recipe.quantize).lower()
    return weights_from_plan(recipe, "full", quant if quant in model_plan.TARGET_TYPES else "q4_k_m", draft_type)


def weights_from_files(target: Path, drafter: Path | None) -> Weights:
    dgpu = _split(_gguf_tensors(drafter))[0] if drafter else 0
    names = target.name + (f" + {drafter.name}" if drafter else "")
    return _target_weights(_gguf_tensors(target), dgpu, f"GGUF files ({names})")
