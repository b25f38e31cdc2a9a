"""`buun tune`'s greedy check: a configuration is eligible only if its greedy output is AR's.

    check = GreedyCheck(prompts, n_tokens)
    check.record(ar_url)                 AR's tokens for each prompt
    check.compare(url) -> Verdict        the same tokens from a DFlash server, or where and why not

Outputs are compared token by token (/completion with return_tokens). Where two builds or batch
shapes round differently, a greedy pick can flip at a near-tie of the target's two best tokens
without anything being wrong: at the first token that differs, the DFlash server's own target is
asked for its two best at that position (n_probs); when they are AR's and DFlash's tokens and
lie within TIE_NATS of each other, the prompt agrees up to a near-tie. Any other difference
makes the configuration ineligible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests

from buun_tool.base.errors import BuunError
from buun_tool.measure.bench_prompts import Prompt

TIE_NATS = 0.1  # two tokens whose log-probabilities differ by less are a near-tie
TIMEOUT_S = 600.0


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        r = requests.post(url + path, json=body, timeout=TIMEOUT_S, allow_redirects=False)
    except requests.RequestException as exc:
        raise BuunError(f"the greedy check's request to {url}{path} failed: {exc}") from None
    try:
        answer = r.json() if r.status_code == 200 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise BuunError(f"the greedy check's request to {url}{path} got HTTP {r.status_code}: {r.text[:200]}")
    return answer


def greedy_tokens(url: str, text: str, n: int) -> list[int]:
    body = {"prompt": text, "n_predict": n, "temperature": 0.0, "ignore_eos": True, "return_tokens": True,
            "cache_prompt": False, "seed": 1}
    tokens = _post(url, "/completion", body).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise BuunError(f"{url}/completion returned no token ids (return_tokens)", "is this buun's llama-server?")
    return tokens


def best_two(url: str, text: str, prefix: list[int]) -> list[tuple[int, float]]:
    """The target's two most likely next tokens (id, log-probability) after `text` and `prefix`."""
    prompt = _post(url, "/tokenize", {"content": text, "add_special": True}).get("tokens") or []
    body = {"prompt": [*prompt, *prefix], "n_predict": 1, "n_probs": 2, "temperature": 0.0, "cache_prompt": False}
    probs = _post(url, "/completion", body).get("completion_probabilities") or [{}]
    top = probs[0].get("top_logprobs") or []
    return [(int(p["id"]), float(p["logprob"])) for p in top[:2] if "id" in p and "logprob" in p]


@dataclass
class Verdict:
    ok: bool
    detail: str
    ties: int = 0  # prompts that agree up to a near-tie

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "ties": self.ties}


@dataclass
class GreedyCheck:
    prompts: list[Prompt]
    n_tokens: int = 48
    reference: dict[str, list[int]] = field(default_factory=dict)

    def record(self, url: str) -> None:
        self.reference = {p.id: greedy_tokens(url, p.text, self.n_tokens) for p in self.prompts}

    def compare(self, url: str) -> Verdict:
        ties = []
        for p in self.prompts:
            want, got = self.reference[p.id], greedy_tokens(url, p.text, self.n_tokens)
            at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
            if at is None:
                if len(want) != len(got):
                    return Verdict(False, f"{p.id}: {len(got)} tokens where AR gave {len(want)}")
                continue
            top = best_two(url, p.text, want[:at])
            pair = {want[at], got[at]}
            if len(top) == 2 and {t for t, _ in top} == pair and abs(top[0][1] - top[1][1]) < TIE_NATS:
                ties.append(f"{p.id} at token {at} (log-probabilities {top[0][1]:.4f} and {top[1][1]:.4f})")
                continue
            return Verdict(False, f"{p.id}: token {at} is {got[at]} where AR's is {want[at]}, not a near-tie "
                           f"(the target's best two there: {top})")
        detail = f"{len(self.prompts)} prompts x {self.n_tokens} tokens equal AR's"
        if ties:
            detail += f"; parted at a near-tie: {'; '.join(ties)}"
        return Verdict(True, detail, len(ties))
