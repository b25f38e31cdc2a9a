"""What a remote client can send to a DFlash llama-server, where buun's patches changed the server:
tree verification (patch 0023), tape-replay rollback (0011, 0024), several slots (0011, 0025, 0026), the
drafter's state in slot saves (0027), the greedy argmax (0013).

The random tiny drafter rarely guesses the target, so nothing would be accepted; a grammar (or a
logit bias) that leaves the target two of the tokens the drafter favours makes it guess right
about half the time: the walk then accepts drafted tokens, which must still be the target's own
samples under the request's constraints. Every output is compared with the same request on a
server without a draft (AR), exactly. The servers run the Q4 pair dequantized to f32
(`tiny_pair_q4_f32`): the Q4 pair's drafter is the one that favours those tokens, and f32
matrices, without flash attention and with an f32 KV cache (EXACT), decode a row alike in a batch
and alone on the CPU. The Q4 pair itself does not: its activations are quantized before each
matmul, so batch-sized rounding flips its near-ties past ~20 tokens (tests/README.md). The
comparisons hold on the CPU build only.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.real_llama_server import Server, concurrently, gpu_layers, llama_server, stream_then_close
from tests.test_correctness import DFLASH, EXACT, TOL_FLOOR, TOP_K, _logprob_diff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(gpu_layers()), reason="exact comparisons with AR hold on the CPU only")]

# Two tokens the tiny Q4 drafter (`tiny_pair`'s seed 0 in tests/support/fixtures_models.py, here
# dequantized) proposes often as its top candidate once the target is held to them: with the target
# restricted to these, drafts are accepted.
FAV, FAV2, OTHER = 147653, 62303, 80498
PIECE, PIECE2 = "<synth_146838>", "<synth_61488>"  # their text
TWO = f"root ::= (<[{FAV}]> | <[{FAV2}]>)+"
ALTERNATING = f"root ::= (<[{FAV}]> <[{FAV2}]>)+"
SHAPED = f"root ::= <[{FAV}]>{{2,5}} (<[{FAV2}]> | <[{FAV}]>)* <[{OTHER}]>"  # ends: EOS allowed after it
BOTH = [[FAV, 100], [FAV2, 100]]  # a logit bias that makes the two win every row
EOS = 248044  # <|endoftext|>: a finished grammar lets it through
PROMPT = "Hello world"
N_CTX = 2048


def _ar_args(target: Path) -> list[str]:
    return ["-m", str(target), "-np", "1", "-c", str(N_CTX), *EXACT]


def _spec_args(pair: tuple[Path, Path], n_slots: int, *extra: str) -> list[str]:
    target, draft = pair
    return ["-m", str(target), "-np", str(n_slots), "-c", str(N_CTX * n_slots), *EXACT, "-md", str(draft),
            *DFLASH, *extra]


@pytest.fixture(scope="module")
def ar(llama_bin: Path, tiny_pair_q4_f32: tuple[Path, Path],
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with llama_server(llama_bin, _ar_args(tiny_pair_q4_f32[0]), tmp_path_factory.mktemp("ar") / "log") as s:
        yield s


@pytest.fixture(scope="module")
def tree(llama_bin: Path, tiny_pair_q4_f32: tuple[Path, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One slot verifying trees of 22 drafted tokens with backend sampling, as the recipe serves
    (`--backend-sampling`), slot saves allowed."""
    folder = tmp_path_factory.mktemp("tree")
    (folder / "saves").mkdir()
    args = _spec_args(tiny_pair_q4_f32, 1, "--spec-tree-budget", "22", "--spec-tree-k", "8", "-bs",
                      "--slot-save-path", f"{folder / 'saves'}/")
    with llama_server(llama_bin, args, folder / "log") as s:
        yield s


@pytest.fixture(scope="module")
def slots4(llama_bin: Path, tiny_pair_q4_f32: tuple[Path, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Four slots, each verifying chains (a tree budget with -np 4 falls back to chains)."""
    folder = tmp_path_factory.mktemp("slots4")
    args = _spec_args(tiny_pair_q4_f32, 4, "--spec-tree-budget", "22")
    with llama_server(llama_bin, args, folder / "log") as s:
        yield s


def _raw(server: Server, path: str, body: dict[str, Any], timeout: float = 120) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=timeout)


def _healthy(server: Server) -> None:
    r = requests.get(server.url + "/health", timeout=10)
    assert r.status_code == 200, f"/health: HTTP {r.status_code}\n{server.log_tail()}"


def _gen(server: Server, n: int, prompt: list[int] | str = PROMPT, **extra: Any) -> dict[str, Any]:
    # complete() is greedy unless extra says otherwise; EOS is allowed unless ignore_eos is passed
    return server.complete(prompt, n, **{"ignore_eos": False, **extra})


def _parted_at_a_near_tie(ar: Server, prompt: list[int], want: list[int], got: list[int],
                          extra: dict[str, Any]) -> bool:
    """Whether `got` is AR's `want` up to its first different token, where AR's own two best tokens
    are those two and lie within TOL_FLOOR of each other in log-probability."""
    j = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if j is None:
        return False
    probe = ar.complete([*prompt, *want[:j]], 1, n_probs=2, **{**extra, "cache_prompt": False})
    top = probe["completion_probabilities"][0]["top_logprobs"][:2]
    return ({t["id"] for t in top} == {want[j], got[j]}
            and abs(top[0]["logprob"] - top[1]["logprob"]) <= TOL_FLOOR)


def _accepted(out: dict[str, Any]) -> int:
    return int(out["timings"].get("draft_n_accepted", 0))



# (request settings, whether drafts must be accepted): each must give AR's tokens
CONSTRAINED = {
    "grammar": ({"grammar": TWO, "ignore_eos": True}, True),
    "grammar alternating": ({"grammar": ALTERNATING, "ignore_eos": True}, False),  # trees accept here, chains not
    "grammar that ends": ({"grammar": SHAPED}, False),
    "grammar and a ban": ({"grammar": TWO, "ignore_eos": True, "logit_bias": [[FAV2, False]]}, True),
    "logit bias": ({"logit_bias": BOTH, "ignore_eos": True}, True),
    "grammar sampled": ({"grammar": TWO, "ignore_eos": True, "temperature": 1.0, "top_k": 0, "seed": 11}, True),
    "bias sampled": ({"logit_bias": BOTH, "ignore_eos": True, "temperature": 1.5, "top_k": 0, "seed": 3}, True),
    "repeat penalty": ({"logit_bias": BOTH, "ignore_eos": True, "repeat_penalty": 1.3, "repeat_last_n": 8}, True),
    "probabilities": ({"grammar": TWO, "ignore_eos": True, "n_probs": 3}, True),
    "post-sampling probabilities": ({"grammar": TWO, "ignore_eos": True, "n_probs": 3, "post_sampling_probs": True},
                                    True),
}


@pytest.mark.parametrize("case", list(CONSTRAINED))
def test_constrained_requests_give_ars_tokens(ar: Server, tree: Server, slots4: Server, case: str) -> None:
    """Grammars, logit biases, penalties and seeded sampling with accepted drafts: the walk samples
    every accepted token with the request's sampler (grammar state, biases, penalties, its RNG),
    so the tokens are AR's, on a tree and on four slots' chains."""
    extra, must_accept = CONSTRAINED[case]
    want = _gen(ar, 24, **extra)
    for name, server in (("tree", tree), ("4 slots", slots4)):
        got = _gen(server, 24, **extra)
        assert got["tokens"] == want["tokens"], f"{name}: the tokens differ from AR's"
        assert got["content"] == want["content"]
        if "n_probs" in extra:
            # one entry a token, AR's token; an accepted draft token's entry has no probabilities
            # (logprob 0, no top_logprobs): upstream's server leaves them unset (`TODO: set result.probs`)
            assert [p["id"] for p in got["completion_probabilities"]] == want["tokens"], f"{name}: probabilities"
        if must_accept:
            assert _accepted(got) > 0, f"{name}: no draft accepted: the check said nothing (drafter changed?)"
    if "grammar" in extra or "logit_bias" in extra:
        allowed = {FAV, FAV2, OTHER, EOS}
        assert set(want["tokens"]) <= allowed, "the constraint did not hold"
    if extra.get("logit_bias") == [[FAV2, False]]:
        assert FAV2 not in want["tokens"]


def test_a_banned_token_never_appears_though_the_drafter_proposes_it(ar: Server, tree: Server,
                                                                     slots4: Server) -> None:
    """The drafter proposes FAV at most steps; banned, it must never be accepted: the output is
    AR's, none of it FAV."""
    bias = [*BOTH, [FAV, False]]
    want = _gen(ar, 30, logit_bias=bias, ignore_eos=True)
    assert FAV not in want["tokens"]
    for server in (tree, slots4):
        got = _gen(server, 30, logit_bias=bias, ignore_eos=True)
        assert got["tokens"] == want["tokens"] and FAV not in got["tokens"]


@pytest.mark.parametrize(("temperature", "seed"), [(1.5, 3), (1.0, 4)])
def test_a_sampled_tree_request_draws_as_ar(ar: Server, tree: Server, temperature: float, seed: int) -> None:
    """A seeded sampled request on a tree server with backend sampling: its tokens are AR's. The
    backend's dist sampler draws one number a row in row order, and a tree's rows are in
    pre-order, so a branch's node took another depth's draw (and a draw came again in the next
    step): the tokens parted from AR's at the first accepted branch (patch 0023 samples such a
    request on the host)."""
    extra = {"logit_bias": BOTH, "ignore_eos": True, "temperature": temperature, "seed": seed}
    want = _gen(ar, 40, **extra)
    got = _gen(tree, 40, **extra)
    assert _accepted(got) > 0, "no draft accepted: the check said nothing (drafter changed?)"
    assert got["tokens"] == want["tokens"]


def test_seeded_sampling_repeats(tree: Server) -> None:
    got = [_gen(tree, 24, grammar=TWO, ignore_eos=True, temperature=1.2, top_k=0, seed=5)["tokens"] for _ in range(2)]
    assert got[0] == got[1]


@pytest.mark.parametrize("stop", [PIECE + PIECE2 + PIECE, PIECE2 + PIECE2, "61488>"])
def test_a_stop_string_inside_accepted_drafts(ar: Server, tree: Server, stop: str) -> None:
    """A stop string met inside a step's accepted tokens ends the request where AR's ends (patch
    0024 drops the accepted tokens after it from the cache); the conversation continued on the
    cache then has the next-token distribution AR's cache gives, up to float rounding (the tree's
    cache was decoded in trees, AR's a token at a time: ~1e-6 apart in f32; a token too many or too
    few in the cache moves it by 0.1 and more), and exactly the one the same tokens give when the
    budget ends them instead: the same steps, batch for batch, a draft's accepted tokens cut after
    the last one alike."""
    want = _gen(ar, 40, grammar=TWO, ignore_eos=True, stop=[stop], cache_prompt=True)
    got = _gen(tree, 40, grammar=TWO, ignore_eos=True, stop=[stop], cache_prompt=True)
    assert got["stop_type"] == want["stop_type"] == "word"
    assert (got["tokens"], got["content"]) == (want["tokens"], want["content"])
    assert _accepted(got) > 0, "no draft accepted: the check said nothing"
    prompt = tree.post("/tokenize", {"content": PROMPT})["tokens"]
    seq = prompt + got["tokens"] + [1234]
    cached = tree.complete(seq, 1, cache_prompt=True, n_probs=TOP_K)
    assert cached["timings"]["prompt_n"] <= 2, "the cache was not reused: nothing was checked"
    # AR's own cache, decoded a token at a time as well
    want_next = ar.complete(seq, 1, cache_prompt=True, n_probs=TOP_K)
    assert _logprob_diff(want_next, cached) <= TOL_FLOOR, "the cache's state is not AR's"
    by_budget = _gen(tree, len(got["tokens"]), grammar=TWO, ignore_eos=True)  # its prompt decoded from scratch
    assert by_budget["tokens"] == got["tokens"]
    same = tree.complete(seq, 1, cache_prompt=True, n_probs=TOP_K)
    assert same["timings"]["prompt_n"] <= 2, "the cache was not reused: nothing was checked"
    assert cached["completion_probabilities"] == same["completion_probabilities"], "a stop leaves another state"


@pytest.mark.parametrize("n_predict", [0, 1, 2, 3, 17])
def test_short_budgets(ar: Server, tree: Server, n_predict: int) -> None:
    """Budgets that end before or inside the first whole draft (patch 0015 drafts past them)."""
    want = _gen(ar, n_predict, grammar=TWO, ignore_eos=True)
    assert _gen(tree, n_predict, grammar=TWO, ignore_eos=True)["tokens"] == want["tokens"]


def test_the_end_of_the_context(ar: Server, tree: Server) -> None:
    """A prompt a few tokens short of the context, with an unbounded and a huge budget: the
    drafts shrink to the room left (a tree needs its budget's), the request ends at the
    context's end as AR's does; a prompt past the context is refused with 400."""
    near = [1000 + (37 * i) % 4000 for i in range(N_CTX - 18)]
    for n in (-1, 10**9):
        want = _gen(ar, n, prompt=near, ignore_eos=True)
        got = _gen(tree, n, prompt=near, ignore_eos=True)
        assert got["tokens"] == want["tokens"] and len(got["tokens"]) > 0
    for server in (ar, tree):
        r = _raw(server, "/completion", {"prompt": near * 2, "n_predict": 4})
        assert r.status_code == 400 and "context size" in r.text
    _healthy(tree)


def test_a_long_prompt_gives_the_drafter_only_its_window(ar: Server, tree: Server) -> None:
    """A prompt of 1500 tokens: the drafter reads the features of its window alone (-cd 256), so
    the prompt's rows before it, with one ubatch of margin, never reach it (patch 0008); the server
    says how many, the output is AR's and the drafts after the prompt are accepted."""
    long = [1000 + (13 * i) % 4000 for i in range(1500)]
    said = "prompt rows before the draft's window were not injected"
    before = tree.log.read_text(errors="replace").count(said)
    want = _gen(ar, 32, prompt=long, grammar=TWO, ignore_eos=True)
    got = _gen(tree, 32, prompt=long, grammar=TWO, ignore_eos=True)
    assert got["tokens"] == want["tokens"] and _accepted(got) > 0
    lines = [line for line in tree.log.read_text(errors="replace").splitlines() if said in line]
    assert len(lines) == before + 1, tree.log_tail()
    found = re.search(r"(\d+) prompt rows", lines[-1])
    assert found and 1024 <= int(found.group(1)) <= 1500 - 256 - 64, lines[-1]


# odd requests and the answer AR gives them (the DFlash servers must give the same)
ODD: dict[str, dict[str, Any]] = {
    "empty prompt": {"prompt": ""},
    "empty token list": {"prompt": []},
    "special tokens only": {"prompt": [248045, 248046, 248044]},
    "special tokens as text": {"prompt": "<|im_start|><|im_end|><|endoftext|>"},
    "token past the vocabulary": {"prompt": [1, 2, 248320]},
    "negative token": {"prompt": [1, 2, -5]},
    "huge token": {"prompt": [1, 2, 2**31 - 1]},
    "bias past the vocabulary": {"prompt": PROMPT, "logit_bias": [[-1, 5], [10**9, 5], [248320, 5]]},
    "bias by text": {"prompt": PROMPT, "logit_bias": [["Hello", False], ["world", 3]]},
    "negative temperature": {"prompt": PROMPT, "temperature": -1.0},
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_requests_answer_as_ar(ar: Server, tree: Server, slots4: Server, case: str) -> None:
    body = {"n_predict": 8, "temperature": 0.0, "return_tokens": True, "cache_prompt": False, **ODD[case]}
    want = _raw(ar, "/completion", body)
    for server in (tree, slots4):
        got = _raw(server, "/completion", body)
        assert got.status_code == want.status_code, got.text[:300]
        if want.status_code == 200:
            assert got.json()["tokens"] == want.json()["tokens"]
        else:
            assert got.json()["error"]["message"] == want.json()["error"]["message"]
        _healthy(server)



def test_cancelled_streams_and_more_requests_than_slots(ar: Server, slots4: Server) -> None:
    """Streams closed mid-draft and six requests of mixed settings on four slots at once: each
    finished request keeps its constraints and gives AR's tokens, and the server stays healthy."""
    prompts = [[1000 + (37 * i + 7 * k) % 4000 for i in range(10 + 9 * k)] for k in range(6)]
    settings = [{}, {"grammar": TWO}, {"logit_bias": [[84444, False]]}, {"logit_bias": BOTH},
                {"n_probs": 2}, {"grammar": TWO, "stop": [PIECE2]}]
    cases = [(prompts[k], 8 + k, {**settings[k], "cache_prompt": bool(k % 2)}) for k in range(6)]
    calls: list[Callable[[], Any]] = [lambda c=c: _gen(slots4, c[1], prompt=c[0], ignore_eos=True, **c[2])
                                      for c in cases]
    stream = {"prompt": PROMPT, "temperature": 0.0, "grammar": TWO, "timeout": 120}
    calls += [lambda: stream_then_close(slots4, 3, **stream), lambda: stream_then_close(slots4, 7, id_slot=1, **stream)]
    got = concurrently(calls)
    for (prompt, n, extra), out in zip(cases, got, strict=False):
        if "stop" not in extra:
            assert len(out["tokens"]) == n
        if "grammar" in extra or extra.get("logit_bias") == BOTH:
            assert set(out["tokens"]) <= {FAV, FAV2}
        if extra.get("logit_bias") == [[84444, False]]:
            assert 84444 not in out["tokens"]
        # AR's tokens, or AR's up to a near-tie: a row of a four-slot batch whose make-up changes
        # with the requests' timing can round apart from the same row alone (seen twice under load)
        want = _gen(ar, n, prompt=prompt, ignore_eos=True, **{**extra, "cache_prompt": False})
        assert out["tokens"] == want["tokens"] or _parted_at_a_near_tie(ar, prompt, want["tokens"], out["tokens"],
                                                                        extra), f"{extra}: the tokens differ from AR's"
    _healthy(slots4)
    # a slot whose stream was closed serves the same request as AR afterwards
    again = _gen(slots4, 16, grammar=TWO, ignore_eos=True, cache_prompt=True, id_slot=1)
    assert again["tokens"] == _gen(ar, 16, grammar=TWO, ignore_eos=True)["tokens"]


def test_a_request_pinned_to_a_busy_slot_leaves_the_slot_alone(ar: Server, slots4: Server) -> None:
    """A request pinned (id_slot) to a slot that serves another waits for it. Upstream's slot
    selection first ran the prompt cache's update on the busy slot: it saved the running request's
    state and loaded the cached state of the pinned prompt into the slot's sequence, and the running
    request went on from there, parting from AR's tokens (the cancelled-streams test's stream pinned
    to slot 1 did this to the request on it, once earlier requests had cached that stream's prompt).
    The running request gives AR's tokens, and the pinned one, served after it, AR's."""
    cached = [2000 + (29 * i) % 3000 for i in range(24)]
    _gen(slots4, 4, prompt=cached, ignore_eos=True, cache_prompt=True, id_slot=2)
    _gen(slots4, 4, prompt=[5, 6], ignore_eos=True, cache_prompt=True, id_slot=2)  # `cached` goes to the prompt cache
    prompt, ban = [1000 + (37 * i) % 4000 for i in range(30)], [[84444, False]]
    body = {"prompt": prompt, "n_predict": 40, "temperature": 0.0, "top_k": 1, "ignore_eos": True, "logit_bias": ban,
            "return_tokens": True, "cache_prompt": False, "id_slot": 1, "stream": True}
    pinned: list[dict[str, Any]] = []
    side = threading.Thread(target=lambda: pinned.append(
        _gen(slots4, 4, prompt=cached, ignore_eos=True, cache_prompt=True, id_slot=1)))
    tokens: list[int] = []
    with requests.post(slots4.url + "/completion", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text[:300]
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                tokens += json.loads(line[6:]).get("tokens", [])
                if tokens and side.ident is None:
                    side.start()  # while the slot generates
    side.join()
    assert len(tokens) == 40 and pinned, "the stream ended early or the pinned request was not sent"
    assert tokens == _gen(ar, 40, prompt=prompt, ignore_eos=True, logit_bias=ban)["tokens"]
    assert pinned[0]["tokens"] == _gen(ar, 4, prompt=cached, ignore_eos=True)["tokens"]


def test_a_prompt_from_the_cache_and_a_checkpoint_decode_as_from_scratch(ar: Server, tree: Server) -> None:
    """Patch 0032: the states a slot leaves in the prompt cache when it takes another prompt (its
    whole state, and its context checkpoints, which the cache shares with the slot instead of
    copying) bring each prompt back: asked again, a prompt's state comes from the cache, its
    checkpoint 4 tokens before its end is restored, and only those tokens are evaluated. Each answer
    is AR's, so the shared and reused buffers held the states they were made from."""
    first = [3000 + (31 * i) % 5000 for i in range(150)]
    second = [4000 + (17 * i) % 3000 for i in range(120)]
    want = {tuple(p): _gen(ar, 12, prompt=p, ignore_eos=True)["tokens"] for p in (first, second)}
    for p in (first, second):  # each prompt decoded from scratch; the second moves the first to the cache
        assert _gen(tree, 12, prompt=p, ignore_eos=True, cache_prompt=True)["tokens"] == want[tuple(p)]
    for p in (first, second, first):  # each back from the cache, the other saved to it
        out = _gen(tree, 12, prompt=p, ignore_eos=True, cache_prompt=True)
        assert out["tokens"] == want[tuple(p)], "a prompt back from the cache gave other tokens than AR's"
        assert out["timings"]["prompt_n"] <= 4, f"evaluated {out['timings']['prompt_n']} of the prompt's tokens"
        assert out["timings"]["cache_n"] == len(p) - out["timings"]["prompt_n"]


def test_slot_save_names(tree: Server) -> None:
    """Names that leave the save folder, or none, are refused with 400; a plain name saves the
    target's state and the drafter's beside it, and restores both."""
    _gen(tree, 8, grammar=TWO, ignore_eos=True, cache_prompt=True)
    for name in ("../x", "/tmp/x.bin", "", ".", "..", "a/b", "a\\b", "nul\x00x"):
        r = _raw(tree, "/slots/0?action=save", {"filename": name})
        assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid filename", (name, r.text[:200])
        r = _raw(tree, "/slots/0?action=restore", {"filename": name})
        assert r.status_code == 400, (name, r.text[:200])
    saved = tree.post("/slots/0?action=save", {"filename": "sp ace.bin"})
    assert saved["n_saved"] > 0
    folder = tree.log.parent / "saves"
    assert {"sp ace.bin", "sp ace.bin.draft"} <= {p.name for p in folder.iterdir()}
    tree.post("/slots/0?action=erase", {})
    assert tree.post("/slots/0?action=restore", {"filename": "sp ace.bin"})["n_restored"] == saved["n_saved"]
    r = _raw(tree, "/slots/0?action=restore", {"filename": "missing.bin"})
    assert r.status_code == 400
    _healthy(tree)


def test_a_slot_save_name_leaves_room_for_the_drafters_file(tree: Server) -> None:
    """With a drafter a save writes NAME and NAME.draft: a NAME valid alone but too long with the
    suffix, or a companion's name, is refused (400) before anything is written. The long name
    failed with HTTP 500 after the target's file was written, which stayed; a save "a.draft"
    overwrote the drafter's state of a save "a" (patch 0027)."""
    _gen(tree, 8, grammar=TWO, ignore_eos=True, cache_prompt=True)
    folder = tree.log.parent / "saves"
    before = sorted(p.name for p in folder.iterdir())
    for name in ("x" * 250, "sp ace.bin.draft"):
        for action in ("save", "restore"):
            r = _raw(tree, f"/slots/0?action={action}", {"filename": name})
            assert r.status_code == 400 and ".draft" in r.json()["error"]["message"], (action, name[:20], r.text[:200])
    assert sorted(p.name for p in folder.iterdir()) == before
    saved = tree.post("/slots/0?action=save", {"filename": "x" * 249})  # 249 + ".draft": 255 bytes
    assert saved["n_saved"] > 0 and (folder / ("x" * 249 + ".draft")).is_file()
    _healthy(tree)
