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

This module is the entry: `run`, and the names other code calls, from the modules of one job each:

    bench_prompts.py     the suites and their prompts
    bench_client.py      one streamed request to a llama-server, /metrics, --url's /health
    bench_run.py         the servers and the requests sent to them (BenchOptions, Sample, ConfigRun)
    bench_summary.py     the rows: speeds, acceptance, ratios
    bench_provenance.py  the machine, the llama.cpp builds, the options, the bandwidth bound's figures
    bench_record.py      BenchResult, bench.json and the chart written
    bench_read.py        a recorded bench.json read back, checked
    bench_tables.py      the tables and lines printed
"""

from __future__ import annotations

import time

from buun_tool.base.errors import UsageError
from buun_tool.measure.bench_client import check_url, request_body, request_timeout, send
from buun_tool.measure.bench_prompts import (
    ALL_MODES,
    MODES,
    SUITES,
    Prompt,
    chat_text,
    load_prompts,
    prompts_from_source,
)
from buun_tool.measure.bench_prompts import _humaneval as _humaneval  # reached by the tests
from buun_tool.measure.bench_provenance import (
    DATASHEET_BANDWIDTH_GBS,
    limits,
    llama_cpp_info,
    machine_info,
    recorded_options,
)
from buun_tool.measure.bench_read import FORMAT, read_json
from buun_tool.measure.bench_record import BenchResult, write_chart, write_json
from buun_tool.measure.bench_run import BenchOptions, ConfigRun, Group, Sample, run_servers
from buun_tool.measure.bench_run import _groups_of as _groups_of  # reached by the tests
from buun_tool.measure.bench_summary import summarize, with_concurrency
from buun_tool.measure.bench_tables import concurrency_table, per_position, table, tree_verdict
from buun_tool.pipeline import patches

# what other code calls by bench.NAME (the report, the command, the tests, docs/benchmarks.md)
__all__ = [
    "DATASHEET_BANDWIDTH_GBS", "FORMAT", "MODES", "SUITES", "BenchOptions", "BenchResult", "ConfigRun", "Group",
    "Prompt", "Sample", "chat_text", "check_url", "concurrency_table", "load_prompts", "per_position",
    "prompts_from_source", "read_json", "record", "request_body", "request_timeout", "run", "send", "summarize",
    "table", "tree_verdict", "with_concurrency", "write_chart", "write_json",
]


def run(opts: BenchOptions) -> BenchResult:
    """Run every configuration over every suite; summarise."""
    for mode in opts.modes:
        if mode not in ALL_MODES:
            raise UsageError(f"unknown mode {mode!r}", f"valid: {', '.join(ALL_MODES)}")
    loaded = {s: load_prompts(s, opts.prompts, opts.long_sizes) for s in opts.suites}
    suites = {s: prompts for s, (prompts, _) in loaded.items()}
    if not opts.url:
        patches.rollback_from_env()  # before any server starts: a misspelt value would run the tape
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    return record(opts, {s: src for s, (_, src) in loaded.items()}, suites, run_servers(suites, opts))


def record(opts: BenchOptions, sources: dict[str, str], suites: dict[str, list[Prompt]], runs: list[ConfigRun]
           ) -> BenchResult:
    """The result of measured runs, with the machine, the builds, the options and the summary rows."""
    options = recorded_options(opts)
    machine = machine_info()
    upstream = any(cfg.build == "upstream" for cfg in opts.configs) and not opts.url
    result = BenchResult(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), machine, llama_cpp_info(upstream),
                         options, sources, runs,
                         prompts=[p for prompts in suites.values() for p in prompts],
                         limits=limits(opts, machine))
    result.rows = with_concurrency(summarize(runs), runs)
    return result
