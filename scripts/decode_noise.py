"""Decoding noise probe: how far apart the same sequence lands when decoded one token at a time,
in one batch, and through speculative decoding with random partial acceptance, per attention path.
Calibrates the correctness harness's tolerances on a new device (see docs/benchmarks.md).

    PYTHONPATH=. python3 scripts/decode_noise.py vendor/build/cuda/bin [VARIANT ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from buun_tool.formats import recipes
from buun_tool.measure import synth
from tests.support.real_llama_server import Server, llama_server

PROMPTS = [[1000 + 37 * i % 4000 for i in range(23)], [2000 + 7 * i % 1000 for i in range(131)]]
VARIANTS = {
    "fa-on": ["-fa", "on"],
    "fa-off": ["-fa", "off"],
    "fa-on-f32kv": ["-fa", "on", "-ctk", "f32", "-ctv", "f32"],
    "fa-off-f32kv": ["-fa", "off", "-ctk", "f32", "-ctv", "f32"],
}
SPEC = ["--spec-type", "dflash", "--draft-max", "16", "-b", "256", "-ub", "64", "--spec-synth-len", "4"]


def top(result: dict) -> dict[int, float]:
    return {p["id"]: p["logprob"] for p in result["completion_probabilities"][0]["top_logprobs"]}


def diff(a: dict, b: dict) -> float:
    ta, tb = top(a), top(b)
    return max(abs(ta[t] - tb[t]) for t in ta if t in tb)


def continuation_gap(gen_server: Server, ref_server: Server, prompt: list[int]) -> float:
    """Generate on `gen_server` (cached), then compare its next-token distribution with a fresh one."""
    seq = prompt + gen_server.complete(prompt, 96, cache_prompt=True)["tokens"] + [1234]
    cached = gen_server.complete(seq, 1, cache_prompt=True, n_probs=10)
    fresh = ref_server.complete(seq, 1, n_probs=10)
    return diff(fresh, cached)


def main(bin_dir: Path, names: list[str]) -> None:
    target, draft = synth.write_pair(recipes.load(), Path("/tmp/noise-models"), scale="tiny",
                                     target_type="f32", draft_type="f32")
    for name, variant in VARIANTS.items():
        if names and name not in names:
            continue
        base = ["-m", str(target), "-np", "1", "-c", "2048", "-ngl", "99", "-ngld", "99", *variant]
        with llama_server(bin_dir, base, Path(f"/tmp/noise-{name}-ar.log")) as ar, \
                llama_server(bin_dir, [*base, "-md", str(draft), *SPEC], Path(f"/tmp/noise-{name}-sp.log")) as sp, \
                llama_server(bin_dir, base, Path(f"/tmp/noise-{name}-ref.log")) as ref:
            control = max(continuation_gap(ar, ref, p) for p in PROMPTS)
            spec = max(continuation_gap(sp, ref, p) for p in PROMPTS)
        print(f"{name:14s} control(incremental vs batch) max {control:.2e}   spec-rollback max {spec:.2e}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
