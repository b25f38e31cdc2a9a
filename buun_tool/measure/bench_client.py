"""One request of `buun bench` to a llama-server: streamed (/completion or /v1/chat/completions),
timed by the client to its first token, its stream and timings checked; /metrics and /health.

    send(url, prompt, mode, n_predict, seed) -> (timings, ttft_ms)   the whole request within a time limit
    request_body(prompt, mode, n_predict, seed) -> (path, body)       greedy, fixed-length, streamed
    scrape(url) -> DFlashStats | None                                 the speculative counters of /metrics
    fit_long(url, prompts) -> prompts                                 the long suite cut to the server's tokens
    check_url(url) -> url                                             --url, once a llama-server answers there
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import requests

from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.measure import bench_long
from buun_tool.measure.bench_prompts import Prompt, chat_text
from buun_tool.measure.bench_read import in_range
from buun_tool.server import metrics
from buun_tool.server.health import Probe, Session, TookTooLong, within

# A line of llama-server's stream is one event, the longest the last with its timings (a few KB);
# events come one a token or fewer, then the end and [DONE]. A server that streams more, or a line
# that never ends, is not measuring what was asked: said so instead of read on forever.
MAX_LINE = 1 << 20
NOT_LLAMA = "is this a llama-server? buun bench measures one by --url"


def _lines(resp: requests.Response, where: str, stop: threading.Event) -> Iterator[bytes]:
    pending = b""
    for chunk in resp.iter_content(65536):
        if stop.is_set():  # the caller gave up on this request
            return
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > MAX_LINE:
            raise BuunError(f"{where} streamed a line of more than {MAX_LINE >> 20} MiB", NOT_LLAMA)
        yield from lines
    if pending:
        yield pending


def _sse_events(resp: requests.Response, where: str, n_predict: int, stop: threading.Event
                ) -> Iterator[dict[str, Any]]:
    most, events = 2 * n_predict + 64, 0
    for raw in _lines(resp, where, stop):
        line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        events += 1
        if events > most:
            raise BuunError(f"{where} streamed more than {most} events for a request of {n_predict} tokens "
                            "(it does not end its stream)", NOT_LLAMA)
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):
            raise BuunError(f"{where} streamed an event that is not JSON: {payload[:100]!r}", NOT_LLAMA) from None
        if not isinstance(event, dict):
            raise BuunError(f"{where} streamed an event that is not a JSON object: {payload[:100]!r}", NOT_LLAMA)
        yield event


def _has_token(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    if isinstance(choices, list):
        deltas = (c.get("delta") for c in choices if isinstance(c, dict))
        return any(isinstance(d, dict) and d.get("content") for d in deltas)
    return bool(event.get("content") or event.get("tokens"))


# What each form of request (bench_prompts.ALL_MODES) adds to a chat request's body.
CHAT_FORMS: dict[str, dict[str, Any]] = {
    "chat": {}, "chat-nothink": {"chat_template_kwargs": {"enable_thinking": False}},
    "chat-sampled": {"temperature": 0.7, "top_p": 0.95}}


def request_body(prompt: Prompt, mode: str, n_predict: int, seed: int) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body of one streamed, fixed-length request: greedy but for the
    chat-sampled form (seeded: the same draws every run)."""
    common = {"stream": True, "ignore_eos": True, "temperature": 0.0, "seed": seed, "cache_prompt": False}
    if mode == "raw":
        return "/completion", {"prompt": prompt.text, "n_predict": n_predict, **common}
    messages = [{"role": "user", "content": chat_text(prompt)}]
    return "/v1/chat/completions", {"messages": messages, "max_tokens": n_predict, **common, **CHAT_FORMS[mode]}


def request_timeout(n_predict: int) -> float:
    """How long one request may take, its stream included: 10 minutes (a long prompt on a slow
    machine) and a second for each token asked for."""
    return 600.0 + n_predict


def send(url: str, prompt: Prompt, mode: str, n_predict: int, seed: int, timeout: float | None = None
         ) -> tuple[dict[str, Any], float | None]:
    """Stream one request; returns the server's timings and the client-side time to first token (ms).
    The whole request may take `timeout` seconds (default: request_timeout): requests' timeout is
    per read, so a server that trickled its bytes, or streamed without end, held the bench forever."""
    limit = request_timeout(n_predict) if timeout is None else timeout
    try:
        session = Session()
        return within(limit, partial(_stream, session, url, prompt, mode, n_predict, seed, limit), session)
    except TookTooLong:
        raise BuunError(f"{url}{request_body(prompt, mode, n_predict, seed)[0]} took more than {limit:g} s for one "
                        f"request of {n_predict} tokens", "is the server busy with other clients, or stalled? "
                        "`buun bench` gives a request 10 minutes and a second per token") from None


def _stream(session: Session, url: str, prompt: Prompt, mode: str, n_predict: int, seed: int, limit: float,
            stop: threading.Event) -> tuple[dict[str, Any], float | None]:
    path, body = request_body(prompt, mode, n_predict, seed)
    where = url + path
    t0 = time.perf_counter()
    ttft, timings = None, None
    # `session`: no proxy in between (the server at --url, as its /health was asked), and cut by
    # `within` when it gives up
    try:
        # no redirect followed: the server measured is the one at --url, not another host it names
        with session, session.post(where, json=body, stream=True, timeout=limit, allow_redirects=False) as resp:
            if resp.status_code != 200:
                raise _answered(resp, where)
            for event in _sse_events(resp, where, n_predict, stop):
                if ttft is None and _has_token(event):
                    ttft = (time.perf_counter() - t0) * 1000
                if event.get("timings") is not None:
                    timings = event["timings"]
    except requests.RequestException as exc:
        raise BuunError(f"request to {where} failed: {exc}") from exc
    if timings is None:
        raise BuunError(f"{where} streamed no timings", NOT_LLAMA)
    return _checked_timings(timings, where), ttft


def _answered(resp: requests.Response, where: str) -> BuunError:
    """The error for an answer other than 200: its status, the start of its body (which may never end)."""
    if resp.is_redirect:
        return BuunError(f"{where} answered HTTP {resp.status_code}, a redirect to {resp.headers.get('location')}",
                         "buun bench measures the server at --url and follows no redirect: pass the llama-server's "
                         "own address as --url")
    try:
        head = next(resp.iter_content(300), b"")[:300]
    except requests.RequestException:
        head = b""
    return BuunError(f"{where} answered HTTP {resp.status_code}: {head.decode('utf-8', errors='replace')}")


def _checked_timings(t: Any, where: str) -> dict[str, Any]:
    """llama-server's timings, each a count or milliseconds of 0 or more: a string, NaN, a negative
    time or tokens in no time were a traceback or a speed of nothing in bench.json."""
    if not isinstance(t, dict):
        raise BuunError(f"{where} streamed timings that are not a JSON object: {json.dumps(t)[:100]}", NOT_LLAMA)
    counts = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted")
    for key in (*counts, "prompt_ms", "predicted_ms"):
        value = t.get(key)
        if value is None and key.startswith("draft"):  # a server without a drafter
            continue
        if not in_range(value) or (key in counts and not isinstance(value, int)):
            raise BuunError(f"{where} streamed timings with {key} {json.dumps(value)[:60]}: expected "
                            f"{'a count of tokens' if key in counts else 'milliseconds'}, 0 or more", NOT_LLAMA)
    if t["predicted_n"] and not t["predicted_ms"]:
        raise BuunError(f"{where} streamed timings of {t['predicted_n']} tokens decoded in 0 ms", NOT_LLAMA)
    return t


def scrape(url: str) -> metrics.DFlashStats | None:
    """The speculative counters of a server's /metrics now; None when it exports none."""
    probe = Probe(url, timeout=10)
    try:
        code, text = probe.get_text("/metrics")
    finally:
        probe.close()
    return metrics.dflash_stats(metrics.parse(text)) if code == 200 else None


def fit_long(url: str, prompts: list[Prompt]) -> list[Prompt]:
    """The long suite's prompts cut to their tokens under this server's tokenizer (bench_long.cut),
    through its /tokenize and /detokenize; other prompts as they are."""
    def ask(path: str, body: dict[str, Any], key: str) -> Any:
        r = requests.post(url + path, json=body, timeout=120, allow_redirects=False)
        try:
            answer = r.json() if r.status_code == 200 else None
        except ValueError:  # not JSON
            answer = None
        if not isinstance(answer, dict) or key not in answer:
            raise BuunError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:200]}", NOT_LLAMA)
        return answer[key]

    def tokenize(text: str) -> list[int]:
        return list(ask("/tokenize", {"content": text}, "tokens"))

    def detokenize(ids: list[int]) -> str:
        return str(ask("/detokenize", {"tokens": ids}, "content"))

    return [Prompt(p.suite, p.id, bench_long.cut(p.text, bench_long.tokens_of(p.id), tokenize, detokenize))
            if p.suite == bench_long.SUITE else p for p in prompts]


def check_url(url: str) -> str:
    """--url, once a llama-server answers its /health there: before the run, so that a server not
    started (or a URL without its http://) is said in one line instead of a failed request's
    traceback text."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {url}: expected the server's address with its scheme, such as http://{url}")
    probe = Probe(url, timeout=10)
    try:
        health = probe.health()
    finally:
        probe.close()
    if health.detail == "loading model":
        raise BuunError(f"the server at {url} is still loading its model",
                        "wait until `buun status` says ready, then run the same command again", Exit.NOT_READY)
    if not health.ok and not health.detail.startswith("HTTP"):  # another HTTP answer: the requests say more
        raise BuunError(f"no server answers at {url} ({health.detail})",
                        "start one (`buun start`; `buun status` shows its endpoint), or leave out --url to bench "
                        "servers buun starts itself", Exit.NETWORK)
    return url.rstrip("/")
