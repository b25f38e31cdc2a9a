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
TOP_K = 10

# Tolerances. A sequence decoded incrementally (1 + draft tokens per step, rolled back) and the
# same sequence decoded in one batch differ by float summation order only: other batch sizes run
# other kernels. How much depends on the device and the attention path, so the rollback check
# measures it on the same servers (the control: plain AR decoding, no speculation, against a
# fresh batch) and allows a few times that. Measured with `-fa on` and f16 KV: CPU ~1e-4 in
# log-probability, CUDA (H200) ~1e-2; with `-fa off` and f32 KV: CPU ~3e-6. A rollback that is
# off by one token, planted in the delta-net state selection, moved them by 0.1-0.2 on the CPU.
NOISE_FACTOR = 5
TOL_FLOOR = 1e-3
TOL_CAP = 0.05  # noise above this leaves the harness unable to judge: it fails instead

# The greedy comparison must not meet ties: random weights give flat distributions whose top two
# tokens are often closer than the -fa on noise. Exact arithmetic (no flash attention, f32 KV)
# keeps the two decodings within ~1e-5, far below the gaps of greedy choices.
EXACT = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]

DFLASH = ["--spec-type", "dflash", "-cd", "256", "--draft-max", "16", "--draft-min", "1", "-b", "256", "-ub", "64"]


def _base(target: Path, *extra: str) -> list[str]:
    return ["-m", str(target), "-np", "1", "-c", "2048", *gpu_layers(), *extra]


def _dflash_args(tiny_pair: tuple[Path, Path], *extra: str) -> list[str]:
    target, draft = tiny_pair
    return [*_base(target), "-md", str(draft), *DFLASH, *extra]


def _spec_stats(result: dict) -> tuple[int, int]:
    t = result["timings"]
    return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))


@pytest.fixture(scope="module")
def ar_server(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """Plain AR decoding with the recipe's attention path (flash attention, f16 KV cache)."""
    target, _ = tiny_pair_f32
    with llama_server(llama_bin, _base(target, "-fa", "on"), tmp_path_factory.mktemp("ar") / "log") as s:
        yield s


def test_lossless_greedy(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = tiny_pair_f32
    drafted = 0
    with llama_server(llama_bin, _base(target, *EXACT), tmp_path / "ar.log") as ar, \
            llama_server(llama_bin, _dflash_args(tiny_pair_f32, *EXACT), tmp_path / "dflash.log") as spec:
        for prompt in PROMPTS:
            want = ar.complete(prompt, N_GEN)["tokens"]
            got = spec.complete(prompt, N_GEN)
            assert len(want) == N_GEN
            assert got["tokens"] == want, "DFlash changed the greedy output"
            drafted += _spec_stats(got)[0]
    assert drafted > 0, "no draft was ever verified: the harness did not exercise DFlash"


def _continuation(server: Server, committed: list[int], cached: bool) -> dict:
    """The next-token distribution after `committed`: on the server's cached state, or from scratch."""
    out = server.complete(committed, 1, cache_prompt=cached, n_probs=TOP_K)
    if cached:
        assert out["timings"]["prompt_n"] <= 2, "the cached state was not reused: nothing was checked"
    else:
        assert out["timings"]["prompt_n"] == len(committed)
    return out


@pytest.mark.parametrize("synth_len", ["2.5", "6"])
def test_rollback_matches_decoding_from_scratch(ar_server: Server, llama_bin: Path,
                                                tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                synth_len: str) -> None:
    args = _dflash_args(tiny_pair_f32, "-fa", "on", "--spec-synth-len", synth_len)
    control, spec_diff = [], []
    with llama_server(llama_bin, args, tmp_path / "synth.log") as spec:
        for prompt in PROMPTS:
            # the control: AR decoding, cached, against the same tokens decoded from scratch
            ar_gen = ar_server.complete(prompt, N_GEN, cache_prompt=True)
            seq = prompt + ar_gen["tokens"] + [1234]
            cached = _continuation(ar_server, seq, True)  # before the fresh run replaces the cache
            control.append(_logprob_diff(_continuation(ar_server, seq, False), cached))
            # speculative decoding with random partial acceptance, then the same comparison
            gen = spec.complete(prompt, N_GEN, cache_prompt=True)
            drafted, accepted = _spec_stats(gen)
            assert 0 < accepted < drafted, f"need partial acceptance, got {accepted}/{drafted}"
            seq = prompt + gen["tokens"] + [1234]
            spec_diff.append(_logprob_diff(_continuation(ar_server, seq, False), _continuation(spec, seq, True)))
    noise = max(control)
    assert noise <= TOL_CAP, f"decoding noise {noise:.3g} is too large for the harness to judge"
    tol = max(TOL_FLOOR, NOISE_FACTOR * noise)
    assert max(spec_diff) <= tol, f"state after rollback differs by {max(spec_diff):.3g} (noise {noise:.3g})"


def _top(result: dict) -> dict[int, float]:
    probs = result["completion_probabilities"][0]["top_logprobs"]
    return {p["id"]: p["logprob"] for p in probs}


def _logprob_diff(ref: dict, got: dict) -> float:
    want, have = _top(ref), _top(got)
    common = [t for t in want if t in have]
    assert len(common) >= TOP_K - 2, f"top tokens differ: {want} vs {have}"
    return max(abs(want[t] - have[t]) for t in common)


def test_seed_server_command_runs_unchanged(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = tiny_pair
    seed = ["-m", str(target), "-md", str(draft), "--spec-type", "dflash", "-ngl", "99", "-ngld", "99",
            "-np", "1", "-c", "6048", "-cd", "256", "-fa", "on", "-b", "256", "-ub", "64", "--jinja"]
    with llama_server(llama_bin, seed, tmp_path / "seed.log") as s:
        out = s.complete("def fibonacci(n):", 32)
        assert len(out["tokens"]) == 32 and _spec_stats(out)[0] > 0
        chat = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert chat["choices"][0]["message"]


def _speculative_simple(llama_bin: Path, tiny_pair: tuple[Path, Path], prompt: str, *extra: str) -> str:
    """Run the seed's llama-speculative-simple command (plus `extra`); return the generated text."""
    target, draft = tiny_pair
    cmd = [str(llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "--spec-type", "dflash",
           "-ngl", "99", "-ngld", "99", "-c", "4096", "--draft-max", "16", "--draft-min", "1", "-p", prompt, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n_drafted = re.search(r"n_drafted\s*=\s*(\d+)", proc.stderr)
    assert n_drafted and int(n_drafted.group(1)) > 0, proc.stderr[-2000:]
    # stdout: the prompt, the generated text, then blank lines the program prints at the end
    assert prompt in proc.stdout, proc.stdout[:500]
    return proc.stdout[proc.stdout.index(prompt) + len(prompt):].rstrip("\n")


def test_seed_speculative_simple_command(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    prompt = "def quicksort(arr):"
    # the seed's command as written (it generates until the context is full: bounded here with -n)
    assert _speculative_simple(llama_bin, tiny_pair_f32, prompt, "-n", "32")
    # and lossless: with exact arithmetic, the same text as greedy decoding without a draft
    generated = _speculative_simple(llama_bin, tiny_pair_f32, prompt, "-n", str(N_GEN), "--temp", "0", *EXACT)
    target, _ = tiny_pair_f32
    with llama_server(llama_bin, _base(target, *EXACT), tmp_path / "ar.log") as ar:
        want = ar.complete(prompt, N_GEN + 32)["content"]
    assert want.startswith(generated), (generated[:200], want[:200])
