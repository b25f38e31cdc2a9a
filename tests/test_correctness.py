"""The DFlash correctness harness: the guard every patch of the series must pass.

Runs the real llama-server and llama-speculative-simple of the build under test (the CPU build in
CI; a CUDA build with BUUN_LLAMA_BIN_DIR=... BUUN_TEST_NGL=99, see scripts/gpu_correctness.sh) on
the tiny synthetic pair: a qwen35 hybrid target (Gated DeltaNet and full-attention layers) and a
dflash drafter reading several of its layers.

- lossless: greedy generation with DFlash is token-for-token the generation without a draft;
- rollback exactness: with synthetic acceptance (`--spec-synth-len`) the server accepts a random
  0..n of each draft, so every verify step ends in a partial rollback of the recurrent state and
  the KV cache. Afterwards, the target's state must equal the state reached by decoding the
  committed tokens from scratch: the next-token log-probabilities after one more token, computed
  on the speculative server's cached state, must match those of a fresh server.
- the seed's own commands run unchanged against the patched build.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.llama_proc import Server, gpu_layers, llama_server

pytestmark = pytest.mark.slow

N_GEN = 128
# Prompts as token ids: the harness is about states, not text. Different lengths put the
# verify blocks at different offsets of the delta-net chunking and of the KV cells.
PROMPTS = [
    [1000 + 37 * i % 4000 for i in range(23)],
    [500 + 11 * i % 3000 for i in range(64)],
    [2000 + 7 * i % 1000 for i in range(131)],
]
# The logits of a sequence decoded incrementally (1 + draft tokens per step, then rolled back)
# and in one prompt batch differ only by float summation order (other batch sizes pick other
# kernel tilings); measured on the CPU build: at most ~1e-4 in log-probability. A wrong rollback
# (one stale token in the delta-net state or the KV cache) moves them by O(0.1-1).
LOGPROB_TOL = 2e-3
TOP_K = 10

DFLASH = ["--spec-type", "dflash", "-cd", "256", "--draft-max", "16", "--draft-min", "1",
          "-fa", "on", "-b", "256", "-ub", "64"]


def _base(target: Path) -> list[str]:
    return ["-m", str(target), "-np", "1", "-c", "2048", *gpu_layers()]


@pytest.fixture(scope="module")
def ar_server(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    target, _ = tiny_pair_f32
    with llama_server(llama_bin, [*_base(target), "-fa", "on"], tmp_path_factory.mktemp("ar") / "log") as s:
        yield s


def _dflash_args(tiny_pair: tuple[Path, Path], *extra: str) -> list[str]:
    target, draft = tiny_pair
    return [*_base(target), "-md", str(draft), *DFLASH, *extra]


def _spec_stats(result: dict) -> tuple[int, int]:
    t = result["timings"]
    return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))


def test_lossless_greedy(ar_server: Server, llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                         tmp_path: Path) -> None:
    drafted = 0
    with llama_server(llama_bin, _dflash_args(tiny_pair_f32), tmp_path / "dflash.log") as spec:
        for prompt in PROMPTS:
            want = ar_server.complete(prompt, N_GEN)["tokens"]
            got = spec.complete(prompt, N_GEN)
            assert len(want) == N_GEN
            assert got["tokens"] == want, "DFlash changed the greedy output"
            drafted += _spec_stats(got)[0]
    assert drafted > 0, "no draft was ever verified: the harness did not exercise DFlash"


@pytest.mark.parametrize("synth_len", ["2.5", "6"])
def test_rollback_matches_decoding_from_scratch(ar_server: Server, llama_bin: Path,
                                                tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                synth_len: str) -> None:
    args = _dflash_args(tiny_pair_f32, "--spec-synth-len", synth_len)
    with llama_server(llama_bin, args, tmp_path / "synth.log") as spec:
        for prompt in PROMPTS:
            gen = spec.complete(prompt, N_GEN, cache_prompt=True)
            drafted, accepted = _spec_stats(gen)
            assert 0 < accepted < drafted, f"need partial acceptance, got {accepted}/{drafted}"
            committed = prompt + gen["tokens"] + [1234]
            # one more token on the speculative server's own state ...
            cont = spec.complete(committed, 1, cache_prompt=True, n_probs=TOP_K)
            assert cont["timings"]["prompt_n"] <= 2, "the cached state was not reused: nothing was checked"
            # ... against the same sequence decoded from scratch
            ref = ar_server.complete(committed, 1, n_probs=TOP_K)
            assert ref["timings"]["prompt_n"] == len(committed)
            _assert_same_distribution(ref, cont)


def _top(result: dict) -> dict[int, float]:
    probs = result["completion_probabilities"][0]["top_logprobs"]
    return {p["id"]: p["logprob"] for p in probs}


def _assert_same_distribution(ref: dict, got: dict) -> None:
    want, have = _top(ref), _top(got)
    assert list(want)[:3] == list(have)[:3], f"top tokens differ: {want} vs {have}"
    diffs = [abs(want[t] - have[t]) for t in want if t in have]
    assert len(diffs) >= TOP_K - 2 and max(diffs) <= LOGPROB_TOL, f"log-probs differ by {max(diffs):.3g}"


def test_seed_server_command_runs_unchanged(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = tiny_pair
    seed = ["-m", str(target), "-md", str(draft), "--spec-type", "dflash", "-ngl", "99", "-ngld", "99",
            "-np", "1", "-c", "6048", "-cd", "256", "-fa", "on", "-b", "256", "-ub", "64", "--jinja"]
    with llama_server(llama_bin, seed, tmp_path / "seed.log") as s:
        out = s.complete("def fibonacci(n):", 32)
        assert len(out["tokens"]) == 32 and _spec_stats(out)[0] > 0
        chat = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert chat["choices"][0]["message"]


def test_seed_speculative_simple_command_is_lossless(ar_server: Server, llama_bin: Path,
                                                     tiny_pair_f32: tuple[Path, Path]) -> None:
    target, draft = tiny_pair_f32
    prompt = "def quicksort(arr):"
    cmd = [str(llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "--spec-type", "dflash",
           "-ngl", "99", "-ngld", "99", "-c", "4096", "--draft-max", "16", "--draft-min", "1", "-p", prompt,
           "-n", str(N_GEN), "--temp", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n_drafted = re.search(r"n_drafted\s*=\s*(\d+)", proc.stderr)
    assert n_drafted and int(n_drafted.group(1)) > 0, proc.stderr[-2000:]
    # stdout: the prompt, the generated text, then blank lines the program prints at the end
    assert prompt in proc.stdout, proc.stdout[:500]
    generated = proc.stdout[proc.stdout.index(prompt) + len(prompt):].rstrip("\n")
    want = ar_server.complete(prompt, N_GEN + 32)["content"]
    assert len(generated) > 0 and want.startswith(generated), (generated[:200], want[:200])
