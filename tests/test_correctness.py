"""The DFlash correctness harness: the guard every patch of the series must pass.

Runs the real llama-server and llama-speculative-simple of the build under test (the CPU build in
CI; a CUDA build with BUUN_LLAMA_BIN_DIR=... BUUN_TEST_NGL=99, see `scripts/gpu_run.sh correctness`) on
the tiny synthetic pair: a qwen35 hybrid target (Gated DeltaNet and full-attention layers) and a
dflash drafter reading several of its layers.

- lossless: greedy generation with DFlash is token-for-token the generation without a draft. On
  the CPU exactly. On a GPU build the same sequence decoded one token at a time and in verify
  batches differs by float summation order, enough to flip the random weights' near-ties, so a
  divergence is allowed where the speculative token is one greedy AR decoding rates closer than
  TIE_TOL_GPU in log-probability to its own choice; AR decoding then follows the speculative path
  from there (the tie rule, `_greedy_matches`, at most MAX_TIES per generation);
- rollback exactness: with synthetic acceptance (`--spec-synth-len`) the server accepts a random
  0..n of each draft, so every verify step ends in a partial rollback of the recurrent state and
  the KV cache. Afterwards, the target's state must equal the state reached by decoding the
  committed tokens from scratch: the next-token log-probabilities after one more token, computed
  on the speculative server's cached state, must match those of a fresh server, within a few
  times the noise two controls measure on the same servers: AR decoding one token at a time, and
  the same tokens fed in 16-token chunks (the verify batch size), each against a fresh batch;
- the seed's own commands run unchanged against the patched build.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.real_llama_server import Server, gpu_layers, llama_server

slow = pytest.mark.slow  # all but the tie rule's own test run real servers

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
# measures it on the same servers (the controls: plain AR decoding, no speculation, one token at a
# time and in verify-sized batches, against a fresh batch) and allows a few times that. Measured
# with `-fa on` and f16 KV: CPU ~1e-4 in log-probability, CUDA (H200) ~1e-2; with `-fa off` and
# f32 KV: CPU ~3e-6. A rollback that is off by one token, planted in the delta-net state
# selection, moved them by 0.1-0.2 on the CPU.
NOISE_FACTOR = 5
TOL_FLOOR = 1e-3
TOL_CAP = 0.05  # noise above this leaves the harness unable to judge: it fails instead

# The greedy comparison must not meet ties: random weights give flat distributions whose top two
# tokens are often closer than the -fa on noise. Exact arithmetic (no flash attention, f32 KV)
# keeps the two decodings within ~1e-5 on the CPU, far below the gaps of greedy choices.
EXACT = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]
# On CUDA even EXACT leaves batch-vs-incremental noise (H200: 9e-3 in log-probability for AR
# decoding, up to 3.3e-2 after speculative rollback, docs/benchmarks.md), so greedy paths may part
# at near-ties: the tie rule steps over a divergence to a token AR rates within TIE_TOL_GPU of its
# own choice, the largest noise the harness judges at all (TOL_CAP). BUUN_TEST_TIE_TOL overrides it.
TIE_TOL_GPU = TOL_CAP
# more ties than this and the comparison no longer says much: it fails instead
MAX_TIES = N_GEN // 8
# a DFlash verify batch: the last sampled token and up to block_size - 1 = 15 drafts
VERIFY_BATCH = 16

DFLASH = ["--spec-type", "dflash", "-cd", "256", "--draft-max", "16", "--draft-min", "1", "-b", "256", "-ub", "64"]

# DDTree verification (patch 0023) under synthetic tree acceptance that often takes a branch: half
# the depths are hard, and there the target takes the drafter's second or third candidate more
# often than its first. The trace (LLAMA_TRACE=1) gives the drafter's rank of each accepted token.
TREE_PROFILE = "0.5:0.9,0.05:0.3,0.4,0.2"
TREE = ["--spec-tree-budget", "22", "--spec-synth-tree", TREE_PROFILE]
TREE_LINE = re.compile(r"accepted +\d+/ *\d+ draft tokens \(tree, ranks \[([\d,]*)\]\)")


def _branches_taken(log: Path) -> int:
    """Tree steps whose accepted path left the drafter's top-1 chain."""
    steps = TREE_LINE.finditer(log.read_text(errors="replace"))
    return sum(any(r != "0" for r in m.group(1).split(",") if r) for m in steps)


def _base(target: Path, *extra: str) -> list[str]:
    return ["-m", str(target), "-np", "1", "-c", "2048", *gpu_layers(), *extra]


def _dflash_args(tiny_pair: tuple[Path, Path], *extra: str) -> list[str]:
    target, draft = tiny_pair
    return [*_base(target), "-md", str(draft), *DFLASH, *extra]


def _spec_stats(result: dict) -> tuple[int, int]:
    t = result["timings"]
    return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))


def _tie_tol() -> float:
    """0 on the CPU: there any divergence fails."""
    override = os.environ.get("BUUN_TEST_TIE_TOL")
    if override:
        return float(override)
    return TIE_TOL_GPU if gpu_layers() else 0.0


def _near_ties(want: dict, j: int, done: int, tie_tol: float, ties: int) -> list[dict[str, Any]]:
    """AR's alternatives closer than tie_tol to its greedy choice at token j of `want` (generated
    token done + j), asserting there are some. Not just the runner-up: noise can lift a third token
    of a three-way near-tie just as well."""
    top = sorted(want["completion_probabilities"][j]["top_logprobs"], key=lambda p: -p["logprob"])
    gap = top[0]["logprob"] - top[1]["logprob"]
    alts = [p for p in top[1:] if top[0]["logprob"] - p["logprob"] < tie_tol]
    assert alts, (f"speculative decoding parts from greedy AR at generated token {done + j} where AR's top-2 gap "
                  f"is {gap:.3g} (tie_tol {tie_tol}): not a near-tie")
    assert ties < MAX_TIES, f"more than {MAX_TIES} near-ties: the comparison would say nothing"
    return alts


def _greedy_matches(ar: Server, prompt: list[int], got: list[int], tie_tol: float) -> int:
    """Check the speculative generation `got` after `prompt` against greedy AR decoding; return the
    near-ties stepped over. At a divergence the speculative token must be one AR rates within
    tie_tol of its greedy choice; AR then continues from the speculative path (the draft run is
    never restarted)."""
    done, ties = 0, 0
    while done < len(got):  # a near-tie at the last token leaves nothing to compare (n_predict 0 is unbounded)
        want = ar.complete(prompt + got[:done], len(got) - done, n_probs=TOP_K)
        j = next((i for i, (a, b) in enumerate(zip(want["tokens"], got[done:], strict=True)) if a != b), None)
        if j is None:
            return ties
        alts = [a["id"] for a in _near_ties(want, j, done, tie_tol, ties)]
        assert got[done + j] in alts, (f"generated token {done + j}: {got[done + j]} is neither AR's greedy "
                                       f"{want['tokens'][j]} nor one of its near-ties {alts}")
        done, ties = done + j + 1, ties + 1
    return ties


def _text_matches(ar: Server, prompt: str, text: str, n: int, tie_tol: float) -> int:
    """`_greedy_matches` for a generation known only as text (llama-speculative-simple prints no
    ids, and the synthetic tokens' text does not tokenize back to them): AR's token pieces locate
    the divergence, and the text there must start with a near-tie's piece. `text` must be a
    prefix of AR's `n` tokens (the program's trailing newlines are stripped)."""
    rest, path, ties = text.encode(errors="surrogateescape"), [], 0
    while True:
        want = ar.complete([prompt, *path], n, n_probs=TOP_K)
        pieces = [bytes(p["bytes"]) for p in want["completion_probabilities"]]
        if b"".join(pieces).startswith(rest):
            return ties
        at, j = 0, 0  # the AR token holding the first differing byte, and where it starts
        while j < len(pieces) and rest.startswith(pieces[j], at):
            at, j = at + len(pieces[j]), j + 1
        assert j < len(pieces), f"AR's {n} tokens are shorter than the speculative text"
        alts = _near_ties(want, j, len(path), tie_tol, ties)
        alt = next((a for a in alts if rest.startswith(bytes(a["bytes"]), at)), None)
        assert alt, (f"generated token {len(path) + j}: {rest[at:at + 40]!r} starts with neither AR's greedy "
                     f"{pieces[j]!r} nor one of its near-ties {[bytes(a['bytes']) for a in alts]}")
        piece = bytes(alt["bytes"])
        path += [*want["tokens"][:j], alt["id"]]
        rest, ties = rest[at + len(piece):], ties + 1


class _FakeAR(Server):
    """Greedy AR decoding of a made-up model: at position p its choice is 100 + p, the runner-up
    200 + p `gaps[p]` (default 1) behind, the third 300 + p another 0.02 behind."""

    def __init__(self, gaps: dict[int, float]):
        super().__init__("fake", Path("fake.log"))
        self.gaps = gaps

    def complete(self, prompt: list[Any] | str, n_predict: int, **extra: Any) -> dict[str, Any]:
        start = sum(isinstance(t, int) for t in prompt)

        def entry(tok: int, logprob: float) -> dict[str, Any]:
            return {"id": tok, "logprob": logprob, "bytes": list(f"<{tok}>".encode())}

        pos = range(start, start + n_predict)
        # the server's shape: the chosen token, and the top ones (here in the wrong order: never relied on)
        probs = [{**entry(100 + p, -1.0), "top_logprobs": [entry(200 + p, -1 - self.gaps.get(p, 1.0)),
                                                           entry(300 + p, -1.02 - self.gaps.get(p, 1.0)),
                                                           entry(100 + p, -1.0)]} for p in pos]
        return {"tokens": [100 + p for p in pos], "completion_probabilities": probs}


@pytest.mark.parametrize(("picks", "gaps", "tie_tol", "ties"), [
    ({}, {}, 0.0, 0),  # the greedy path itself
    ({5: 205}, {5: 0.01}, 0.0, None),  # on the CPU no tie is allowed
    ({5: 205, 9: 209}, {5: 0.01, 9: 0.04}, 0.05, 2),
    ({5: 205}, {5: 0.1}, 0.05, None),  # the runner-up, but too far behind
    ({5: 305}, {5: 0.01}, 0.05, 1),  # the third, within the tolerance too
    ({5: 305}, {5: 0.04}, 0.05, None),  # the third, too far behind
    ({5: 999}, {5: 0.01}, 0.05, None),  # not among AR's top tokens
    ({p: 200 + p for p in range(0, 2 * MAX_TIES + 2, 2)}, dict.fromkeys(range(64), 0.01), 0.05, None),  # too many
])
def test_tie_rule(picks: dict[int, int], gaps: dict[int, float], tie_tol: float, ties: int | None) -> None:
    """The tie rule on a fake AR server, with token ids and with text (no llama.cpp needed)."""
    got = [picks.get(p, 100 + p) for p in range(64)]
    text = "".join(f"<{t}>" for t in got[:60])  # a prefix of what AR generates, as for the seed command
    for check in (lambda: _greedy_matches(_FakeAR(gaps), [], got, tie_tol),
                  lambda: _text_matches(_FakeAR(gaps), "prompt", text, 64, tie_tol)):
        if ties is None:
            with pytest.raises(AssertionError):
                check()
        else:
            assert check() == ties


@pytest.fixture(scope="module")
def ar_server(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """Plain AR decoding with the recipe's attention path (flash attention, f16 KV cache). No context
    checkpoints: to take one the server would decode a prompt's last 4 tokens as a batch of their
    own, and the chunked control needs each chunk decoded as one batch."""
    target, _ = tiny_pair_f32
    args = _base(target, "-fa", "on", "-ctxcp", "0")
    with llama_server(llama_bin, args, tmp_path_factory.mktemp("ar") / "log") as s:
        yield s


@pytest.fixture(scope="module")
def ar_exact(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """Plain AR decoding with exact arithmetic (EXACT): the reference of the greedy comparisons,
    one server for the module. Its tests send it no request with cache_prompt, so every request
    decodes its prompt from scratch, in the same batches whichever test ran before."""
    target, _ = tiny_pair_f32
    with llama_server(llama_bin, _base(target, *EXACT), tmp_path_factory.mktemp("ar-exact") / "log") as s:
        yield s


class _ScriptedAR:
    """AR as _greedy_matches asks it: greedy tokens 5, 6, 7 after a prompt of 2, each with token 8
    as a runner-up 0.02 behind (a near-tie)."""

    GREEDY = [5, 6, 7]

    def complete(self, prompt: list[int], n: int, n_probs: int) -> dict[str, Any]:
        assert n > 0, "n_predict 0 asks llama-server for an unbounded generation"
        start = len(prompt) - 2
        tokens = self.GREEDY[start:start + n]
        return {"tokens": tokens, "completion_probabilities": [
            {"top_logprobs": [{"id": t, "logprob": -0.50}, {"id": 8, "logprob": -0.52}]} for t in tokens]}


def test_greedy_matches_steps_over_a_near_tie_at_the_last_token() -> None:
    ar: Any = _ScriptedAR()
    assert _greedy_matches(ar, [1, 2], [5, 6, 8], tie_tol=0.05) == 1
    assert _greedy_matches(ar, [1, 2], [5, 8, 7], tie_tol=0.05) == 1
    with pytest.raises(AssertionError, match="not a near-tie"):
        _greedy_matches(ar, [1, 2], [5, 6, 8], tie_tol=0.01)


@slow
def test_lossless_greedy(ar_exact: Server, llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                         tmp_path: Path) -> None:
    drafted, ties, tie_tol = 0, [], _tie_tol()
    with llama_server(llama_bin, _dflash_args(tiny_pair_f32, *EXACT), tmp_path / "dflash.log") as spec:
        for prompt in PROMPTS:
            got = spec.complete(prompt, N_GEN)
            assert len(got["tokens"]) == N_GEN
            ties.append(_greedy_matches(ar_exact, prompt, got["tokens"], tie_tol))
            drafted += _spec_stats(got)[0]
    print(f"near-ties stepped over per prompt: {ties} (tie_tol {tie_tol})")  # for the GPU run's record
    assert drafted > 0, "no draft was ever verified: the harness did not exercise DFlash"


@slow
def test_lossless_greedy_with_backend_sampling(ar_exact: Server, llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    """With -bs the verify's greedy choices are argmaxes computed in the target's graph (patch 0013
    makes a greedy request's chain a lone argmax there): still the AR tokens."""
    with llama_server(llama_bin, _dflash_args(tiny_pair_f32, *EXACT, "-bs"), tmp_path / "dflash.log") as spec:
        got = spec.complete(PROMPTS[0], N_GEN)
        _greedy_matches(ar_exact, PROMPTS[0], got["tokens"], _tie_tol())
    assert _spec_stats(got)[0] > 0, "no draft was ever verified"


@slow
def test_greedy_requests_pick_the_full_chains_token(ar_server: Server, llama_bin: Path,
                                                    tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    """Patch 0013: a greedy request (temperature 0, no sampler on that can move the top token) takes
    the argmax of its biased logits row, on the host or with -bs in the graph, instead of running
    the full sampler chain over the vocabulary; a request for probabilities (n_probs) still runs
    the chain. Same server, same logits: the tokens must be the chain's, also with a logit bias
    that bans the top token (the fallback scan) and one that lifts the runner-up above it."""
    prompt, n = PROMPTS[1], 24
    first = ar_server.complete(prompt, 1, n_probs=2)["completion_probabilities"][0]["top_logprobs"]
    top, second = first[0], first[1]
    lift = top["logprob"] - second["logprob"] + 0.5  # logprob gaps are logit gaps
    cases = {"none": [], "top banned": [[top["id"], False]], "runner-up lifted": [[second["id"], lift]]}
    fast = {name: ar_server.complete(prompt, n, logit_bias=bias)["tokens"] for name, bias in cases.items()}
    for name, bias in cases.items():
        assert fast[name] == ar_server.complete(prompt, n, logit_bias=bias, n_probs=1)["tokens"], name
    assert fast["none"][0] == top["id"]
    assert fast["top banned"][0] != top["id"] and top["id"] not in fast["top banned"]
    assert fast["runner-up lifted"][0] == second["id"]

    target, _ = tiny_pair_f32
    with llama_server(llama_bin, _base(target, "-fa", "on", "-ctxcp", "0", "-bs"), tmp_path / "bs.log") as bs:
        for name, bias in cases.items():
            assert bs.complete(prompt, n, logit_bias=bias)["tokens"] == fast[name], f"-bs: {name}"


# request settings (over Server.complete's temperature 0, top_k 1) and whether patch 0013 samples
# them with the lone argmax: only where no sampler on can move the top token
GREEDY_CASES = [
    ({}, True),
    ({"top_k": 40, "top_p": 0.5, "min_p": 0.3, "top_n_sigma": 1.0}, True),  # each keeps the top token
    ({"repeat_penalty": 1.3}, False),
    ({"presence_penalty": 0.5}, False),
    ({"dry_multiplier": 0.8}, False),
    ({"xtc_probability": 0.5, "xtc_threshold": 0.1}, False),
    ({"typical_p": 0.5}, False),
    ({"dynatemp_range": 0.5}, False),
    ({"mirostat": 2}, False),
    ({"n_probs": 2}, False),  # probabilities come from the chain
    ({"samplers": ["top_k", "min_p"]}, False),  # no temperature in the chain: it samples
    ({"temperature": 0.7}, False),
]
CHAIN_LINE = re.compile(r"sampler chain: (.*)")  # logged at -lv 4 when a task starts


def _logged(log: Path, pattern: re.Pattern[str], n: int) -> str:
    """The server's log once `pattern` matches in it n times: the log is written by a thread of its own."""
    deadline = time.monotonic() + 10
    while len(pattern.findall(text := log.read_text(errors="replace"))) < n:
        assert time.monotonic() < deadline, f"{pattern.pattern!r} logged fewer than {n} times"
        time.sleep(0.05)
    return text


@slow
def test_only_greedy_requests_take_the_argmax(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    target, _ = tiny_pair_f32
    log = tmp_path / "server.log"
    with llama_server(llama_bin, _base(target, "-lv", "4"), log) as s:
        for i, (extra, greedy) in enumerate(GREEDY_CASES):
            s.complete(PROMPTS[0], 1, **extra)
            chains = CHAIN_LINE.findall(_logged(log, CHAIN_LINE, i + 1))
            assert (chains[i].strip() == "logits -> logit-bias -> greedy") == greedy, (extra, chains[i])


RESERVE_LINE = re.compile(r"sched_reserve: reserving")  # logged at -lv 4


@slow
def test_a_like_sampler_keeps_the_scheduler(llama_bin: Path, upstream_build_dir: Path,
                                            tiny_pair_f32: tuple[Path, Path], tmp_path: Path) -> None:
    """Patch "llama: like samplers keep the scheduler": with backend sampling (-bs) each request
    registers its sampler chain with the context, and upstream re-reserves the scheduler at every
    change: new compute buffers, every graph rebuilt at new addresses (on CUDA, captured again). A
    chain like the one the scheduler was reserved with keeps it. Three greedy requests then a
    sampled one: upstream's build reserves for each of the four, the series' for the first and for
    the sampled chain only. The greedy requests' tokens are the same either way: the same as
    upstream's where both builds run on the CPU; on a GPU (the harness's BUUN_TEST_NGL) upstream's
    build here is the CPU's, whose float sums differ from the card's, so the reference is this build's
    own greedy tokens without -bs (in the Ampere PTX run of 2026-11-29 the card's and the CPU's
    tokens parted at a near-tie, index 5 of the first prompt)."""
    target, _ = tiny_pair_f32
    sampled = {"temperature": 0.8, "top_k": 40}
    reserves: dict[str, int] = {}
    tokens: dict[str, list[list[int]]] = {}
    for name, bin_dir in (("buun", llama_bin), ("upstream", upstream_build_dir / "upstream-cpu" / "bin")):
        log = tmp_path / f"reserve-{name}.log"
        with llama_server(bin_dir, _base(target, "-bs", "-lv", "4"), log) as s:
            before = len(RESERVE_LINE.findall(log.read_text(errors="replace")))
            tokens[name] = [s.complete(p, 8)["tokens"] for p in PROMPTS[:3]]
            s.complete(PROMPTS[0], 8, **sampled)
            # a task's timings are logged after its decodes, so after any reserve they made
            reserves[name] = len(RESERVE_LINE.findall(_logged(log, GRAPHS_REUSED, 4))) - before
    assert reserves == {"buun": 2, "upstream": 4}
    reference = tokens["upstream"]
    if gpu_layers():
        with llama_server(llama_bin, _base(target), tmp_path / "no-bs.log") as s:
            reference = [s.complete(p, 8)["tokens"] for p in PROMPTS[:3]]
    assert tokens["buun"] == reference


# The token a continuation samples is never decoded, so which one it is does not matter: it is
# forced to a whole character ("a", 64 in the byte-level vocabularies of both pairs), because the
# server leaves the probabilities out of a reply whose text ends inside a UTF-8 character. The
# probabilities are the raw logits', before the bias.
WHOLE_CHAR = [[64, 1000]]


def _continuation(server: Server, committed: list[int], cached: bool) -> dict:
    """The next-token distribution after `committed`: on the server's cached state, or from scratch."""
    out = server.complete(committed, 1, cache_prompt=cached, n_probs=TOP_K, logit_bias=WHOLE_CHAR)
    if cached:
        assert out["timings"]["prompt_n"] <= 2, "the cached state was not reused: nothing was checked"
    else:
        assert out["timings"]["prompt_n"] == len(committed)
    return out


def _chunked_continuation(server: Server, n_prompt: int, committed: list[int]) -> dict:
    """The next-token distribution after `committed` decoded in batches the way speculative decoding
    does: the first `n_prompt` tokens (and the odd remainder) from scratch, then VERIFY_BATCH tokens
    per request on the cached state. The token each request samples is never decoded, so the slot
    holds exactly the request's prompt and the next request extends it."""
    ends = list(range(len(committed), n_prompt, -VERIFY_BATCH))[::-1]
    out = server.complete(committed[:ends[0]], 1)
    for end in ends[1:]:
        out = server.complete(committed[:end], 1, cache_prompt=True, n_probs=TOP_K, logit_bias=WHOLE_CHAR)
        assert out["timings"]["prompt_n"] == VERIFY_BATCH, "the server did not decode just the new chunk"
    return out


def _rollback_diffs(ar: Server, spec: Server, prompt: list[int], n: int = N_GEN) -> tuple[float, float, float]:
    """For one prompt: the controls, AR decoding one token at a time and in verify-sized chunks
    against the same tokens decoded from scratch; then speculative decoding with random partial
    acceptance (`spec`, cache kept) against a fresh decode of the tokens it committed."""
    ar_gen = ar.complete(prompt, n, cache_prompt=True)
    seq = prompt + ar_gen["tokens"] + [1234]
    cached = _continuation(ar, seq, True)  # before the fresh run replaces the cache
    fresh = _continuation(ar, seq, False)
    incremental = _logprob_diff(fresh, cached)
    chunked = _logprob_diff(fresh, _chunked_continuation(ar, len(prompt), seq))
    gen = spec.complete(prompt, n, cache_prompt=True)
    drafted, accepted = _spec_stats(gen)
    assert 0 < accepted < drafted, f"need partial acceptance, got {accepted}/{drafted}"
    seq = prompt + gen["tokens"] + [1234]
    return incremental, chunked, _logprob_diff(_continuation(ar, seq, False), _continuation(spec, seq, True))


def _assert_state_within_noise(diffs: list[tuple[float, float, float]]) -> None:
    """The states after rollback within NOISE_FACTOR times the controls' largest noise."""
    incremental, chunked, spec_diff = (list(col) for col in zip(*diffs, strict=True))
    noise = max(incremental + chunked)
    print(f"noise: incremental {max(incremental):.3g}, chunked {max(chunked):.3g}; "
          f"after rollback {max(spec_diff):.3g}")  # for the GPU run's record
    assert noise <= TOL_CAP, f"decoding noise {noise:.3g} is too large for the harness to judge"
    tol = max(TOL_FLOOR, NOISE_FACTOR * noise)
    assert max(spec_diff) <= tol, f"state after rollback differs by {max(spec_diff):.3g} (noise {noise:.3g})"


@slow
@pytest.mark.parametrize("synth", [["--spec-synth-len", "2.5"], ["--spec-synth-len", "6"], TREE],
                         ids=["chain-2.5", "chain-6", "tree-22"])
def test_rollback_matches_decoding_from_scratch(ar_server: Server, llama_bin: Path,
                                                tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                synth: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """For a tree (patch 0023) the step commits the accepted path by tape replay from the state
    before the tree (patch 0021), also where the path left the drafter's top-1 chain: the trace
    must show such steps. A parent off by one in that replay moves the state by ~5 in
    log-probability (test-tree-decode's neighbour control)."""
    monkeypatch.setenv("LLAMA_TRACE", "1")
    args = _dflash_args(tiny_pair_f32, "-fa", "on", *synth)
    with llama_server(llama_bin, args, tmp_path / "synth.log") as spec:
        diffs = [_rollback_diffs(ar_server, spec, prompt) for prompt in PROMPTS]
    _assert_state_within_noise(diffs)
    if synth is TREE:
        assert _branches_taken(tmp_path / "synth.log") > 0, "no step accepted a branch off the top-1 chain"


@slow
def test_a_request_that_ends_inside_a_draft_keeps_its_cache(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """Patch 0024: a step accepts tokens past the request's budget (0015 keeps drafts whole); they
    leave the slot's cache, so continuing with the tokens sent reuses the cache (at most two tokens
    evaluated) instead of going back to a context checkpoint (45 tokens before the patch). Budgets
    that end inside a draft, with partial acceptance at the last step and without, for a chain and
    for a tree."""
    for name, synth in (("chain", ["--spec-synth-len", "6"]), ("tree", TREE)):
        args = _dflash_args(tiny_pair_f32, "-fa", "on", *synth)
        with llama_server(llama_bin, args, tmp_path / f"{name}.log") as spec:
            for n in (40, 41, 42, 43):
                gen = spec.complete(PROMPTS[0], n, cache_prompt=True)
                assert len(gen["tokens"]) == n
                out = spec.complete(PROMPTS[0] + gen["tokens"] + [1234], 1, cache_prompt=True)
                # the new token, and the request's last one where no step decoded it
                assert out["timings"]["prompt_n"] <= 2, f"{name}, n_predict {n}: the cache was not reused"


@slow
def test_tree_greedy_equals_ar(ar_exact: Server, llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                               tmp_path: Path) -> None:
    """Patch 0023: a tree step walks the verified tree by the target's own greedy choices, so the
    output is AR's token for token, for budgets below, just above and well above the chain's 15
    (each step decodes a tree, commits its path and gives the drafter the path's features). The
    random drafter's trees are rarely accepted, so a step makes about one token: 32 tokens a
    request keep this within a couple of minutes on the CPU."""
    n_gen = 32
    for budget, prompts in (("4", PROMPTS[:1]), ("16", PROMPTS[1:2]), ("22", PROMPTS)):
        log = tmp_path / f"tree-{budget}.log"
        args = _dflash_args(tiny_pair_f32, *EXACT, "--spec-tree-budget", budget)
        with llama_server(llama_bin, args, log) as spec:
            for prompt in prompts:
                got = spec.complete(prompt, n_gen)
                assert len(got["tokens"]) == n_gen
                _greedy_matches(ar_exact, prompt, got["tokens"], _tie_tol())
                assert _spec_stats(got)[0] >= int(budget), "no tree was verified"
        assert f"tree verification: budget {budget}, 8 candidates per depth" in log.read_text(errors="replace")


@slow
def test_a_tree_of_one_candidate_per_depth_is_the_chain(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    """With one candidate per depth (--spec-tree-k 1) the tree is the drafter's chain, decoded and
    committed as a tree: under the same synthetic tree acceptance and seed it gives the chain's
    tokens and acceptance exactly."""
    runs = {}
    for name, extra in (("chain", []), ("tree", ["--spec-tree-budget", "22", "--spec-tree-k", "1"])):
        args = _dflash_args(tiny_pair_f32, *EXACT, "--spec-synth-tree", TREE_PROFILE, *extra)
        with llama_server(llama_bin, args, tmp_path / f"{name}.log") as spec:
            runs[name] = [(g["tokens"], _spec_stats(g)) for g in (spec.complete(p, N_GEN) for p in PROMPTS)]
    assert runs["tree"] == runs["chain"]
    assert all(0 < accepted < drafted for _, (drafted, accepted) in runs["chain"]), runs["chain"]


# Tape replay (patch 0011) against upstream's snapshot planes: the replay runs the ops the verify
# ran, on the same inputs, so the two rollbacks should agree to the last bit where kernels are
# deterministic (the CPU: 0.0 measured). On CUDA a bound far below the decoding noise.
TAPE_TOL = 1e-5
TAPE_TOL_GPU = 1e-3


def _tape_tol() -> float:
    return TAPE_TOL_GPU if gpu_layers() else TAPE_TOL


@slow
def test_tape_replay_equals_snapshots(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same synthetic acceptance on two servers of the same build, one rolling back by tape
    replay, the other by upstream's snapshot planes (LLAMA_RS_ROLLBACK=snapshot): the same tokens,
    and the same next-token log-probabilities on their cached states."""
    args = _dflash_args(tiny_pair_f32, *EXACT, "--spec-synth-len", "2.5", "-lv", "4")
    tol = _tape_tol()
    # one server after the other (an RPC worker of the GPU run serves one at a time); the same
    # request seeds draw the same synthetic acceptance on both
    gens: dict[str, list[dict]] = {}
    conts: dict[str, list[dict]] = {}
    for mode in ("snapshot", "tape"):
        monkeypatch.setenv("LLAMA_RS_ROLLBACK", mode)
        with llama_server(llama_bin, args, tmp_path / f"{mode}.log") as server:
            for k, prompt in enumerate(PROMPTS):
                gen = server.complete(prompt, N_GEN, cache_prompt=True, seed=100 + k)
                gens.setdefault(mode, []).append(gen)
                conts.setdefault(mode, []).append(_continuation(server, prompt + gen["tokens"] + [1234], True))
    diffs = []
    for tape, snapshot, c_tape, c_snapshot in zip(gens["tape"], gens["snapshot"], conts["tape"], conts["snapshot"],
                                                  strict=True):
        assert tape["tokens"] == snapshot["tokens"]
        drafted, accepted = _spec_stats(tape)
        assert 0 < accepted < drafted and _spec_stats(snapshot) == (drafted, accepted)
        diffs.append(_logprob_diff(c_snapshot, c_tape))
    print(f"tape replay vs snapshots: {max(diffs):.3g}")  # for the GPU run's record
    assert "rollback = snapshots" in (tmp_path / "snapshot.log").read_text()
    assert "rollback = tape replay" in (tmp_path / "tape.log").read_text()
    assert max(diffs) <= tol, f"tape replay and snapshot rollback differ by {max(diffs):.3g}"


@slow
@pytest.mark.parametrize("synth", [["--spec-synth-len", "2.5"], TREE], ids=["chain", "tree-22"])
def test_state_after_rollbacks_survives_slot_save_and_restore(ar_exact: Server, llama_bin: Path,
                                                               tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                               synth: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0011 saves a sequence state whose last rollback still waits for its replay as the state
    before the verify plus the tape tokens to replay. Generations that a stop string ends inside an
    accepted draft leave such a state (n_predict alone never does: the server drafts no more than
    the tokens left); a slot saved then, overwritten and restored must hold the state decoding
    its tokens from scratch gives, and the same next-token log-probabilities as the live state had
    before it was overwritten (exactly on the CPU, within TAPE_TOL_GPU on CUDA). On CUDA the
    from-scratch comparison carries the batch-size noise of the rollback test (~1e-2 measured),
    so there it is held to TOL_CAP, the most the harness judges. With a tree (patch 0023) the
    accepted paths, branches among them (the trace shows them), are committed the same way."""
    monkeypatch.setenv("LLAMA_TRACE", "1")
    tol_exact, tol_scratch = _tape_tol(), TOL_CAP if gpu_layers() else TOL_FLOOR
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    args = _dflash_args(tiny_pair_f32, *EXACT, *synth, "--slot-save-path", f"{save_dir}/")
    restored, scratch = [], []
    with llama_server(llama_bin, args, tmp_path / "spec.log") as spec:
        for i, prompt in enumerate(PROMPTS):
            tokens = spec.complete(prompt, N_GEN)["tokens"]  # greedy and seeded: the run below repeats it
            pieces = [spec.post("/detokenize", {"tokens": [t]})["content"] for t in tokens]
            # stop at the first token past the middle whose text does not occur before it
            j = next(j for j in range(N_GEN // 2, N_GEN) if pieces[j].strip() and pieces[j] not in "".join(pieces[:j]))
            gen = spec.complete(prompt, N_GEN, cache_prompt=True, stop=[pieces[j]])
            assert gen["stop_type"] == "word" and _spec_stats(gen)[1] > 0
            saved = spec.post("/slots/0?action=save", {"filename": f"s{i}.bin"})
            seq = (prompt + tokens)[:saved["n_saved"]] + [1234]
            live = _continuation(spec, seq, True)  # the saved state, before anything overwrites it
            spec.complete([7, 8, 9], 2)  # the slot now holds something else
            spec.post("/slots/0?action=restore", {"filename": f"s{i}.bin"})
            back = _continuation(spec, seq, True)
            restored.append(_logprob_diff(live, back))
            scratch.append(_logprob_diff(_continuation(ar_exact, seq, False), back))
    print(f"restored vs live state {max(restored):.3g}, vs decoding from scratch {max(scratch):.3g}")
    assert max(restored) <= tol_exact, f"the restored state differs from the saved one by {max(restored):.3g}"
    assert max(scratch) <= tol_scratch, f"restored state differs from decoding from scratch by {max(scratch):.3g}"
    if synth is TREE:
        assert _branches_taken(tmp_path / "spec.log") > 0, "no step accepted a branch off the top-1 chain"


# a draft candidate of the DFlash drafter (common/speculative.cpp logs three per drafted position with -v)
DRAFT_LINE = re.compile(r"draft candidate +\d+, pos +\d+: +\d+ \( *[-\d.]+\)")


def _drafts_by_features(llama_bin: Path, args: list[str], prompts: list[list[int]], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, tuple[list[str], list, Path]]:
    """The drafter's logged candidates, the generations and the log of one server with the target's
    features on the device ("1") and of one with them through the host ("0")."""
    runs = {}
    for device in ("1", "0"):
        monkeypatch.setenv("LLAMA_DFLASH_DEVICE_FEATURES", device)
        log = tmp_path / f"{name}-{device}.log"
        with llama_server(llama_bin, args, log) as spec:
            tokens = [spec.complete(prompt, N_GEN)["tokens"] for prompt in prompts]
        text = log.read_text(errors="replace")
        assert f"target features of verify batches: {'on the device' if device == '1' else 'through the host'}" in text
        runs[device] = (DRAFT_LINE.findall(text), tokens, log)
    candidates = runs["1"][0]
    assert len(candidates) >= 3 * N_GEN, f"only {len(candidates)} draft candidates logged"
    return runs


@slow
def test_device_features_draft_as_host_features(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0014: the target's features of a verify batch stay on the device and the draft
    injects them from there. The draft sees its context only through those features, so a wrong
    row, layer or position changes its candidates: every step's candidates (token and probability)
    and the generation must be those of upstream's path through the host
    (LLAMA_DFLASH_DEVICE_FEATURES=0), for a prompt short enough to be captured on the device and
    one that goes through the host."""
    args = _dflash_args(tiny_pair_f32, "--spec-synth-len", "2.5", "-v")
    runs = _drafts_by_features(llama_bin, args, [PROMPTS[0][:12], PROMPTS[1]], tmp_path, monkeypatch, "features")
    assert runs["1"][:2] == runs["0"][:2], "the draft's candidates differ between device and host features"


@slow
def test_a_trees_path_reaches_the_drafter_as_through_the_host(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0022: a tree step gives the drafter its accepted path's features in one decode, their
    rows gathered on the device and padded to the chain's injection at positions past the path,
    which the step then clears. The drafter's candidates and the tokens must be those of the path
    through the host (LLAMA_DFLASH_DEVICE_FEATURES=0, padded alike: on CUDA a matmul's rows depend
    on its column count), also where paths left the top-1 chain, and from the device the
    injection's graph is built once a task (after the prompt's injection, a graph of its own), not
    again for each path of another length or with a branch."""
    monkeypatch.setenv("LLAMA_TRACE", "1")
    monkeypatch.setenv("LLAMA_SPEC_PROFILE", "1")
    args = _dflash_args(tiny_pair_f32, *TREE, "-v")
    runs = _drafts_by_features(llama_bin, args, PROMPTS[:2], tmp_path, monkeypatch, "tree-features")
    device_log = runs["1"][2]
    assert _branches_taken(device_log) > 0, "no step accepted a branch off the top-1 chain"
    rebuilt = [int(m.group(11)) for m in PROFILE_LINE.finditer(device_log.read_text(errors="replace"))]
    assert rebuilt == [1, 1], f"the path's injection built its graph in {rebuilt} steps of each task"
    assert runs["1"][:2] == runs["0"][:2], "the draft's candidates of a tree's path differ between device and host"


PROFILE_LINE = re.compile(r"spec profile: steps=(\d+) ms/step:((?: \w+=[\d.]+)+) total=([\d.]+) "
                          r"rows/step=([\d.]+) accept/row=([\d.]+) rebuilt=(\d+) verify/rebuilt=([\d.]+) "
                          r"verify/next=([\d.]+) verify/steady=([\d.]+) draft_rebuilt=(\d+) inject_rebuilt=(\d+)")
VERIFY_LINE = re.compile(r"task (\d+) \| accepted +(\d+)/ *\d+ draft tokens")  # a verify step, with LLAMA_TRACE=1


@slow
def test_spec_profile_accounts_for_every_step(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0010: with LLAMA_SPEC_PROFILE=1 the server logs, when a task ends, the mean ms per
    speculative step of each phase, the number of steps, the target rows the accept phase
    sampled, and the steps whose verify built the target's graph instead of reusing it (a task's
    first verify, after its prompt's graph; 0015 keeps the drafts of its last steps whole), with
    the verify time of those, of the steps right after them and of the rest, and the steps whose
    draft or feature injection reused none of the drafter's graphs. The
    server's trace (LLAMA_TRACE=1) logs every verify step with its accepted drafts, and a step
    samples those plus one row, so the counts must agree, for each of two tasks on one server
    (the last step of a task ends inside the task); without the variable no profile is logged."""
    args = _dflash_args(tiny_pair_f32, "--spec-synth-len", "2.5")
    monkeypatch.setenv("LLAMA_TRACE", "1")
    for enabled in (False, True):
        if enabled:
            monkeypatch.setenv("LLAMA_SPEC_PROFILE", "1")
        else:
            monkeypatch.delenv("LLAMA_SPEC_PROFILE", raising=False)
        log = tmp_path / f"profile-{enabled}.log"
        with llama_server(llama_bin, args, log) as spec:
            gens = [spec.complete(prompt, N_GEN) for prompt in PROMPTS[:2]]
        text = log.read_text(errors="replace")
        verified: dict[str, list[int]] = {}  # accepted drafts per verify step, by task, in order
        for v in VERIFY_LINE.finditer(text):
            verified.setdefault(v.group(1), []).append(int(v.group(2)))
        assert [sum(ks) for ks in verified.values()] == [_spec_stats(g)[1] for g in gens], "no trace of the steps"
        profiles = list(PROFILE_LINE.finditer(text))
        if not enabled:
            assert not profiles and "spec profile" not in text
            continue
        assert len(profiles) == len(gens), f"expected one profile line per task, got {len(profiles)}"
        for m, steps_accepted in zip(profiles, verified.values(), strict=True):
            _check_profile(m, steps_accepted)


GRAPHS_REUSED = re.compile(r"graphs reused = +(\d+)")


@slow
def test_verify_graph_is_reused_to_the_end_of_the_budget(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    """Patch "server: whole drafts to the budget end": a DFlash draft keeps its full length when
    fewer tokens than that are left of the request's budget, so the verify batch keeps its shape
    and its graph is reused to the end of the request instead of rebuilt for each shorter draft (as
    upstream's server shortens it: a graph each of the last 15 steps). At synthetic AL 1 a step
    adds one token: after the prompt, a request of N tokens runs N - 1 verify steps, and only the
    prompt's graph and the first verify's are built. The draft statistics are upstream's: the
    positions past the budget are not counted, at AL 1 (nothing accepted) as when every drafted
    token is accepted (synthetic AL 16, the whole draft of 15)."""
    n = 48
    reused = 0
    stats: dict[str, tuple[int, int]] = {}
    for al in ("1", "16"):
        log = tmp_path / f"reuse-{al}.log"
        with llama_server(llama_bin, _dflash_args(tiny_pair_f32, "--spec-synth-len", al), log) as spec:
            out = spec.complete(PROMPTS[0], n)
        assert len(out["tokens"]) == n, "the budget still ends the request"
        stats[al] = _spec_stats(out)
        if al == "1":
            counts = [int(m.group(1)) for m in GRAPHS_REUSED.finditer(log.read_text(errors="replace"))]
            assert counts, "no graph statistics in the server log"
            reused = counts[-1]
    assert reused >= n - 3, f"the target's graph was reused {reused} times in {n - 1} verify steps"
    # AL 1: with R tokens left a draft shortened to the budget has min(15, R - 1) positions, R = 47..1
    assert stats["1"] == (15 * 31 + 15 * 16 // 2, 0)
    # the whole draft accepted: 16 + 16 tokens, then 15 left, of which the last draft counts 14
    assert stats["16"] == (15 + 15 + 14, 15 + 15 + 14)


@slow
def test_kv_cells_crossing_256_keep_the_verify_graph(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch "kv-cache: n_kv padded to 1024 cells": n_kv, part of every graph's shape, is padded
    to 1024 cells, so a request that grows its cache past 256 cells keeps verifying with the graph
    of its first verify (the profile's `rebuilt` counts the verifies that built a graph); upstream's
    padding of 256 rebuilt it at the crossing (2)."""
    monkeypatch.setenv("LLAMA_SPEC_PROFILE", "1")
    n = 320  # 16 tokens a step (every draft accepted): the cache passes 256 cells mid-request
    log = tmp_path / "pad.log"
    with llama_server(llama_bin, _dflash_args(tiny_pair_f32, "--spec-synth-len", "16"), log) as spec:
        out = spec.complete(PROMPTS[0], n)
    assert len(out["tokens"]) == n
    profiles = list(PROFILE_LINE.finditer(log.read_text(errors="replace")))
    assert len(profiles) == 1, "expected one profile line"
    assert int(profiles[0].group(6)) == 1, "a verify past 256 cells built its graph again"


@slow
def test_drafter_keeps_both_graphs(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch "llama: second scheduler for the drafter": the drafter's context alternates two
    graphs every step, the injection of the verify batch's features (no outputs) and the draft
    (outputs); its small batches without outputs run on a second scheduler, so both graphs are
    reused from step to step (with one scheduler, as upstream, both were built in every step). The
    profile counts the steps whose draft or injection built its graph: in the first task one each
    (the first step's), in the next none for the draft and one for the injection (the task's
    prompt went through the same scheduler)."""
    monkeypatch.setenv("LLAMA_SPEC_PROFILE", "1")
    log = tmp_path / "sched-alt.log"
    with llama_server(llama_bin, _dflash_args(tiny_pair_f32, "--spec-synth-len", "2.5"), log) as spec:
        for prompt in PROMPTS[:2]:
            spec.complete(prompt, N_GEN)
    profiles = list(PROFILE_LINE.finditer(log.read_text(errors="replace")))
    assert len(profiles) == 2, "expected one profile line per task"
    first, second = [(int(m.group(1)), int(m.group(10)), int(m.group(11))) for m in profiles]
    assert first[0] > 2 and second[0] > 2, "too few steps to tell a reused graph from a rebuilt one"
    assert first[1:] == (1, 1) and second[1:] == (0, 1), f"(steps, draft, inject) rebuilt per task: {first}, {second}"


GRAPH_NODES = re.compile(r"sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)")


@slow
def test_sampling_runs_once_over_a_sequences_rows(llama_bin: Path, tiny_pair_f32: tuple[Path, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0019: with backend sampling (-bs) a sampler chain that works row by row (the greedy
    request's argmax, the draft's top-k) runs once over a sequence's consecutive rows instead of
    once per row, so the graphs of the verify and of the draft, reserved once their samplers are
    set, have fewer nodes; a result's rows come back to the host in one strided copy. The draft's
    candidates of every step (token and probability) and the generated tokens must be those of
    the per-row graphs (LLAMA_SAMPLER_ROWS=0, upstream's), and so must a sampled request's, whose
    chain (a random draw per row) still runs once per row."""
    args = _dflash_args(tiny_pair_f32, "--spec-synth-len", "2.5", "-bs", "-v")
    runs = {}
    for rows in ("1", "0"):
        monkeypatch.setenv("LLAMA_SAMPLER_ROWS", rows)
        log = tmp_path / f"rows-{rows}.log"
        with llama_server(llama_bin, args, log) as spec:
            tokens = [spec.complete(prompt, N_GEN // 2)["tokens"] for prompt in PROMPTS[:2]]
            tokens.append(spec.complete(PROMPTS[0], N_GEN // 4, temperature=0.8, top_k=40, seed=7)["tokens"])
        text = log.read_text(errors="replace")
        runs[rows] = tokens, DRAFT_LINE.findall(text), [int(n) for n in GRAPH_NODES.findall(text)]
    (tokens, candidates, nodes), (tokens_0, candidates_0, nodes_0) = runs["1"], runs["0"]
    assert len(candidates) >= 3 * N_GEN, f"only {len(candidates)} draft candidates logged"
    assert candidates == candidates_0, "the draft's candidates differ when its top-k runs once over the rows"
    assert tokens == tokens_0, "the tokens differ when sampling runs once over the rows"
    # the reserves match but for two: the drafter's and the target's with their greedy samplers set
    # (the sampled request's, last, runs once per row either way)
    differ = [i for i, (a, b) in enumerate(zip(nodes, nodes_0, strict=True)) if a != b]
    assert len(differ) == 2 and differ[-1] < len(nodes) - 1, (nodes, nodes_0)
    assert all(nodes[i] < nodes_0[i] for i in differ), (nodes, nodes_0)


def _check_profile(m: re.Match[str], verified: list[int]) -> None:
    """A profile line against the verify steps of its task (accepted drafts of each)."""
    steps, rows_per_step = int(m.group(1)), float(m.group(4))
    phases = {k: float(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    assert list(phases) == ["draft", "prep", "verify", "inject", "clone", "accept", "commit"]
    assert phases["draft"] > 0 and phases["verify"] > 0 and phases["accept"] > 0
    assert abs(sum(phases.values()) - float(m.group(3))) <= 0.01
    assert steps == len(verified)
    assert abs(rows_per_step * steps - sum(k + 1 for k in verified)) <= 0.005 * steps + 1e-6
    assert float(m.group(5)) == pytest.approx(phases["accept"] / rows_per_step, rel=0.02, abs=2e-3)
    assert int(m.group(6)) == 1 and float(m.group(7)) > 0, "only the first verify builds its graph"
    # the verify time split three ways: the rebuilt first step, the one after it, the rest
    rebuilt, after, steady = (float(m.group(i)) for i in (7, 8, 9))
    assert steps >= 3 and after > 0 and steady > 0
    assert rebuilt + after + steady * (steps - 2) == pytest.approx(phases["verify"] * steps, abs=0.002 * steps)
    assert 0 <= int(m.group(10)) <= steps and 0 <= int(m.group(11)) <= steps


def _top(result: dict) -> dict[int, float]:
    probs = result["completion_probabilities"][0]["top_logprobs"]
    return {p["id"]: p["logprob"] for p in probs}


def _logprob_diff(ref: dict, got: dict) -> float:
    want, have = _top(ref), _top(got)
    common = [t for t in want if t in have]
    assert len(common) >= TOP_K - 2, f"top tokens differ: {want} vs {have}"
    return max(abs(want[t] - have[t]) for t in common)


@slow
def test_seed_server_command_runs_unchanged(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = tiny_pair
    seed = ["-m", str(target), "-md", str(draft), "--spec-type", "dflash", "-ngl", "99", "-ngld", "99",
            "-np", "1", "-c", "6048", "-cd", "256", "-fa", "on", "-b", "256", "-ub", "64", "--jinja"]
    with llama_server(llama_bin, seed, tmp_path / "seed.log") as s:
        out = s.complete("def fibonacci(n):", 32)
        assert len(out["tokens"]) == 32 and _spec_stats(out)[0] > 0
        chat = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert chat["choices"][0]["message"]


def _speculative_simple_cmd(llama_bin: Path, tiny_pair: tuple[Path, Path], prompt: str, *extra: str) -> list[str]:
    """The seed's llama-speculative-simple command, plus `extra`."""
    target, draft = tiny_pair
    return [str(llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "--spec-type", "dflash",
            "-ngl", "99", "-ngld", "99", "-c", "4096", "--draft-max", "16", "--draft-min", "1", "-p", prompt, *extra]


def _speculative_simple(llama_bin: Path, tiny_pair: tuple[Path, Path], prompt: str, *extra: str) -> str:
    """Run the seed's llama-speculative-simple command (plus `extra`); return the generated text."""
    proc = subprocess.run(_speculative_simple_cmd(llama_bin, tiny_pair, prompt, *extra), capture_output=True,
                          timeout=600)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-3000:]
    # stdout: the prompt, the generated text, then blank lines the program prints at the end. The
    # random weights' tokens may end mid-character: surrogateescape keeps every byte (see _text_matches)
    out = proc.stdout.decode(errors="surrogateescape")
    n_drafted = re.search(r"n_drafted\s*=\s*(\d+)", err)
    assert n_drafted and int(n_drafted.group(1)) > 0, \
        f"{len(err)} bytes of stderr, {len(out)} of stdout ending {out[-300:]!r}; stderr's end:\n{err[-2000:]}"
    assert prompt in out, out[:500]
    return out[out.index(prompt) + len(prompt):].rstrip("\n")


# ptrace(2) requests and waitpid's flag for threads (<sys/ptrace.h>, <sys/wait.h>)
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 17, 0x4206, 0x4207, 0x40000000
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())


def _ptrace(request: int, tid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(request, tid, None, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}) of thread {tid}: {os.strerror(err)}")


def _threads(pid: int) -> dict[int, str]:
    """Each thread of `pid` and its state letter (R running, S sleeping, t traced...)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended
            out[int(tid)] = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return out


def _stop_log_worker(pid: int) -> int:
    """Stop the log's worker thread of process `pid` (common_init starts it first, so it is the
    lowest thread id after main's) while it waits for lines, holding no lock that main needs;
    return its id."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = sorted(t for t in _threads(pid) if t != pid)
        if workers:
            tid = workers[0]
            _ptrace(PTRACE_SEIZE, tid)
            _ptrace(PTRACE_INTERRUPT, tid)
            os.waitpid(tid, WALL)
            if int(Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]) == SYS_FUTEX:
                return tid
            _ptrace(PTRACE_DETACH, tid)  # caught writing: let it go and try again
        time.sleep(0.001)
    raise AssertionError(f"no log worker thread in process {pid} to stop in 60 s")


@slow
@pytest.mark.skipif(SYS_FUTEX is None, reason="the futex syscall's number is known for x86_64 and aarch64")
def test_speculative_simple_writes_its_whole_log_before_it_exits(llama_bin: Path,
                                                                 tiny_pair_f32: tuple[Path, Path]) -> None:
    """llama-speculative-simple logs through a worker thread's queue, and its statistics are its last
    lines: the program must not exit with lines still queued (patch 0034). Once in a cold CI run it
    exited 0 with its log ending at the drafter's set-up, its worker not run since under the load.
    Here the worker is stopped (ptrace) from the start: a program that exits without waiting for it
    loses its whole log; one that waits sleeps at its end until the worker is let go."""
    cmd = _speculative_simple_cmd(llama_bin, tiny_pair_f32, "def quicksort(arr):", "-n", "16")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else b""), daemon=True)
    reader.start()
    worker, exited = 0, False
    try:
        worker = _stop_log_worker(proc.pid)
        # either the process ends (the worker, traced, is reaped here) or all its other threads
        # sleep, the worker's queue unwritten, for 10 samples in a row
        deadline, asleep = time.monotonic() + 300, 0
        while not exited and asleep < 10:
            assert time.monotonic() < deadline, f"the program neither ended nor slept: {_threads(proc.pid)}"
            exited = os.waitpid(worker, os.WNOHANG | WALL)[0] != 0
            others = [s for t, s in _threads(proc.pid).items() if t != worker]
            asleep = asleep + 1 if others and all(s == "S" for s in others) else 0
            time.sleep(0.03)
    finally:
        if worker and not exited:
            _ptrace(PTRACE_DETACH, worker)  # let it go, whatever stopped the test
        try:
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
            reader.join(timeout=60)
    log = err[0].decode(errors="replace") if err else ""
    assert rc == 0, log[-3000:]
    assert re.search(r"n_drafted\s*=\s*[1-9]", log), \
        f"the program exited with its log unwritten: {len(log)} bytes of stderr, ending:\n{log[-2000:]}"


@slow
def test_seed_speculative_simple_command(ar_exact: Server, llama_bin: Path, tiny_pair_f32: tuple[Path, Path]) -> None:
    """The seed's command as written runs; and with exact arithmetic its greedy text is that of AR
    decoding without a draft: a prefix of the AR server's text on the CPU, the same up to the tie
    rule on a GPU build (`_text_matches`: the program prints text only)."""
    prompt = "def quicksort(arr):"
    # it generates until the context is full: bounded here with -n
    assert _speculative_simple(llama_bin, tiny_pair_f32, prompt, "-n", "32")
    generated = _speculative_simple(llama_bin, tiny_pair_f32, prompt, "-n", str(N_GEN), "--temp", "0", *EXACT)
    ties = _text_matches(ar_exact, prompt, generated, N_GEN + 32, _tie_tol())
    print(f"near-ties stepped over: {ties}")
