"""The `long` suite of `buun bench`: prompts of 8K and 30K tokens (--long-tokens), as agent clients
send them (a repository's files, then a request about them), for prefill tok/s and time to first
token beside decode tok/s at a long context.

    long_texts(sizes, limit) -> [("long/8192", text), ("long/30720", text)]   (bench_prompts: Prompts)
    cut(text, n, tokenize, detokenize) -> the text cut to n tokens of the server's own tokenizer
    context_for(sizes, n_predict) -> the -c that holds the longest and its answer

The files are made by a seeded generator, not read from anywhere, so every machine and every buun
version sends the same text (SOURCE names its version), made longer than any tokenizer needs and
cut, on each server, to the prompt's tokens under that server's tokenizer: a real model's and a
`buun synth` model's count the same text differently. They are Python of plausible shape with
random names and numbers: what a prefill costs does not depend on the text, but a real drafter's
acceptance does, and on this text it says nothing about real code (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from buun_tool.base.errors import UsageError

SUITE = "long"
SOURCE = "buun long-context generator v1 (seed 0)"
SIZES = (8192, 30720)  # the prompts' tokens unless --long-tokens says otherwise
# Characters the generator writes per token asked for: more than any tokenizer here needs (the
# Qwen3.5 tokenizer reads 2.99 characters a token of this text, `buun synth`'s vocabulary 1.4),
# so that every server's cut (cut) finds enough text.
GEN_CHARS_PER_TOKEN = 3.2
CHAT_SLACK = 64  # tokens the chat template adds around a prompt
CTX_STEP = 256
ASK = "\nThe files above are the repository you are working in."

_WORDS = ("cache", "index", "token", "batch", "slot", "queue", "buffer", "layer", "model", "graph", "tensor",
          "request", "stream", "window", "prompt", "budget", "device", "worker", "record", "state", "plan",
          "route", "score", "limit", "retry", "shard", "block", "frame", "event", "signal", "offset", "weight")
_VERBS = ("load", "merge", "split", "count", "check", "build", "resolve", "trim", "pack", "scan", "rank", "flush")
_OPS = ("+", "-", "*", "//", "%")


def _function(rng: random.Random) -> tuple[str, str]:
    verb, noun = rng.choice(_VERBS), rng.choice(_WORDS)
    name, args = f"{verb}_{noun}", rng.sample(_WORDS, rng.randint(1, 3))
    lines = [f"def {name}({', '.join(f'{a}: int' for a in args)}, limit: int = {rng.randint(2, 512)}) -> int:",
             f'    """{verb.capitalize()} the {noun} from {", ".join(args)}; at most `limit`."""',
             "    total = 0"]
    for a in args:
        lines += [f"    for i in range({a} % limit):",
                  f"        if i {rng.choice(('<', '>', '=='))} {rng.randint(1, 99)}:",
                  f"            total {rng.choice(_OPS)}= {a} {rng.choice(_OPS[:3])} {rng.randint(1, 9999)}",
                  "        else:",
                  f"            total = (total + i) % {rng.randint(10007, 99991)}"]
    lines.append("    return min(total, limit)")
    return name, "\n".join(lines) + "\n"


def _repository(rng: random.Random, chars: int) -> tuple[str, str, str]:
    """Files of about `chars` characters, and the module in their middle with its first function,
    to ask about."""
    files: list[str] = []
    named: list[tuple[str, str]] = []
    while sum(map(len, files)) < chars:
        module = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{len(files)}"
        funcs = [_function(rng) for _ in range(rng.randint(3, 7))]
        files.append("\n\n".join([f"# ---- src/{module}.py ----",
                                   f'"""{module.replace("_", " ").capitalize()}: helpers of the service."""', "",
                                   *(body for _, body in funcs)]) + "\n")
        named.append((module, funcs[0][0]))
    module, func = named[len(named) // 2]
    return "".join(files), module, func


def _text(n: int) -> str:
    rng = random.Random(f"{SOURCE}/{n}")
    files, module, func = _repository(rng, int(n * GEN_CHARS_PER_TOKEN))
    return files + f"{ASK} Explain what `{func}` in src/{module}.py computes, then write a pytest test for it.\n"


def prompt_id(n: int) -> str:
    return f"{SUITE}/{n}"


def tokens_of(pid: str) -> int:
    """The tokens a prompt of the suite is made for, from its id."""
    return int(pid.rsplit("/", 1)[1])


def long_texts(sizes: tuple[int, ...] = SIZES, limit: int | None = None) -> list[tuple[str, str]]:
    """The suite's prompts as (id, text), in the order of `sizes` (the first `limit`)."""
    chosen = sizes[:limit] if limit else sizes
    return [(prompt_id(n), _text(n)) for n in chosen]


def cut(text: str, n: int, tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str]) -> str:
    """`text` cut to n tokens of a server's tokenizer: its files shortened, its request kept whole.
    A cut between two tokens can merge differently when the server reads the text again: the
    prompt then has a token or two more or less than n."""
    at = text.rindex(ASK)
    files, ask = text[:at], text[at:]
    keep = max(n - len(tokenize(ask)), 0)
    ids = tokenize(files)
    return text if len(ids) <= keep else detokenize(ids[:keep]) + ask


def context_for(sizes: tuple[int, ...], n_predict: int) -> int:
    """The -c a server needs for the longest prompt of `sizes`, the chat template and an answer of
    `n_predict` tokens, rounded up to CTX_STEP."""
    return math.ceil((max(sizes) + CHAT_SLACK + n_predict) / CTX_STEP) * CTX_STEP


def parse_sizes(value: str) -> tuple[int, ...]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(v.isdigit() and int(v) >= 64 for v in items):
        raise UsageError(f"--long-tokens {value!r}: expected a comma-separated list of prompt sizes in tokens, "
                         "each 64 or more", "for example --long-tokens 8192,30720 (the default)")
    return tuple(int(v) for v in items)
