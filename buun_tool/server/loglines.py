"""Reading llama-server's output: where a load is at, and why a run failed.

These are contracts with llama.cpp's log text (re-check them after a llama.cpp bump):
the load phases below, "error: invalid argument: X" and 'error while handling argument "X"'
from the argument parser, "couldn't bind HTTP server socket", the model loader's "failed to
load model" family, and allocation failures ("failed to allocate", "out of memory").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from buun_tool.base.errors import BuunError, Exit
from buun_tool.server import addresses

# (pattern, phase shown while STARTING), in the order llama-server prints them; a phase only
# moves forward (the memory-fitting pass prints some of these early).
PHASES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), name) for p, name in (
    (r"loading model '", "loading the target model"),
    (r"load_tensors:", "loading tensors"),
    (r"llama_kv_cache|llama_memory_recurrent", "allocating the KV cache"),
    (r"threadpool init|warming up", "warming up"),
    (r"loading draft model", "loading the DFlash drafter"),
    (r"initializing, n_slots", "initializing slots"),
    (r"adding speculative implementation", "setting up speculative decoding"),
    (r"model loaded", "model loaded"),
    (r"listening on", "listening"),
))
PHASE_ORDER = {name: i for i, (_, name) in enumerate(PHASES)}

# Lines worth showing first when a run fails.
KNOWN_PREFIXES = ("CUDA error", "GGML_ASSERT", "out of memory", "terminate called", "Segmentation fault",
                  "error:", "failed to", "unable to allocate", "std::bad_alloc", "Aborted")

_INVALID_FLAG = re.compile(r"error: invalid argument: (\S+)|unknown argument: (\S+)")
_BAD_VALUE = re.compile(r'error while handling argument "([^"]+)": ?(.*)')
_OOM = re.compile(r"out of memory|cudaMalloc failed|failed to allocate|unable to allocate|std::bad_alloc"
                  r"|ggml_gallocr_reserve_n: failed|failed to create context", re.IGNORECASE)
_MODEL = re.compile(r"failed to load (draft )?model|error loading model|failed to open GGUF|gguf_init_from_file"
                    r".*fail|failed to initialize speculative", re.IGNORECASE)
_BIND = re.compile(r"couldn't bind HTTP server socket|address already in use", re.IGNORECASE)
# ggml-rpc's aborts at a worker (ggml-rpc.cpp): none answers there, or it runs another protocol version
_RPC_CONNECT = re.compile(r"ggml-rpc\.cpp:\d+: Failed to connect to (\S+)")
_RPC_VERSION = re.compile(r"RPC server version mismatch: (\S+)|RPC handshake failed for (\S+)")
# ggml-rpc's RPC_STATUS_ASSERT: a worker's address answered bytes that are not ggml-rpc's
_RPC_MALFORMED = re.compile(r"Remote RPC server crashed or returned malformed response")

NOT_A_WORKER_HINT = ("check each --rpc HOST:PORT: `buun worker status` on that machine shows the worker's "
                     "address; if another program holds the port, start the worker with another --port")
OOM_HINT = ("use less memory: a smaller context (-c 4096), a quantized KV cache (-ctk q8_0 -ctv q8_0, or q4_0), "
            "or fewer layers on the GPU (-ngl N); for example `buun serve -- -c 4096 -ctk q8_0 -ctv q8_0`")


# Lines that look like failures but are llama.cpp's normal chatter.
_NOISE = re.compile(r"this warning is normal|fitting without it|no usable GPU found|one possible reason"
                    r"|consult docs/build.md")


_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] +")  # llama.cpp's "0.01.930.562 I " timestamp and level


def clean(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def phase_of(line: str, current: str = "") -> str | None:
    """The load phase `line` starts, if it moves past `current`."""
    for pattern, name in PHASES:
        if pattern.search(line):
            return name if PHASE_ORDER[name] > PHASE_ORDER.get(current, -1) else None
    return None


def last_phase(lines: Iterable[str]) -> str:
    """The load phase the output reached ("" before the first)."""
    phase = ""
    for line in lines:
        phase = phase_of(line, phase) or phase
    return phase


def notable(lines: Iterable[str]) -> list[str]:
    return [ln for ln in lines
            if not _NOISE.search(ln) and any(p.lower() in ln.lower() for p in KNOWN_PREFIXES)]


@dataclass(frozen=True)
class Failure:
    kind: str  # bad-flag, bad-value, oom, model, bind, crash
    message: str
    hint: str | None
    fatal: bool  # restarting cannot fix it
    exit_code: Exit = Exit.FAILED


def _first(pattern: re.Pattern[str], lines: Sequence[str]) -> tuple[re.Match[str], str] | None:
    for line in lines:
        m = None if _NOISE.search(line) else pattern.search(line)
        if m:
            return m, clean(line)
    return None


def diagnose(lines: Sequence[str], recipe_flags: Iterable[str] = ()) -> Failure | None:
    """The cause a user can act on, from llama-server's last lines; None when none is known."""
    from buun_tool.base.command import canonical  # flags compare by canonical spelling

    from_recipe = {canonical(f) for f in recipe_flags}
    if hit := _first(_INVALID_FLAG, lines):
        flag = hit[0].group(1) or hit[0].group(2)
        if canonical(flag) in from_recipe:
            hint = (f"{flag} comes from the recipe: this llama.cpp build lacks the buun patches "
                    f"(run `buun patch` and `buun build`), or replace it (`buun serve -- FLAG VALUE`) "
                    f"or leave it out (`buun serve --drop {flag}`)")
        else:
            hint = "fix or remove it in the arguments after `--` (`llama-server --help` lists the flags)"
        return Failure("bad-flag", f"llama-server does not know the flag {flag}", hint, True, Exit.USAGE)
    if hit := _first(_BAD_VALUE, lines):
        flag, reason = hit[0].group(1), hit[0].group(2).strip() or "invalid value"
        hint = (f"change or drop {flag} (`buun serve --drop {flag}`)" if canonical(flag) in from_recipe
                else f"fix the value of {flag} in the arguments after `--`")
        return Failure("bad-value", f"llama-server rejected {flag}: {reason}", hint, True, Exit.USAGE)
    if hit := _first(_RPC_VERSION, lines):
        found = [m for ln in lines if (m := _RPC_VERSION.search(ln))]
        worker = next((m[2] for m in found if m[2]), "a worker")
        version = next((f" (its RPC protocol is {m[1]})" for m in found if m[1]), "")
        return Failure("rpc", f"llama-server and the worker {worker} speak different RPC protocol versions{version}",
                       "run the same buun and llama.cpp build on the worker (`buun build` there) as here", True,
                       Exit.NOT_READY)
    if hit := _first(_RPC_CONNECT, lines):
        worker = hit[0].group(1)
        return Failure("rpc", f"llama-server could not connect to the worker {worker}",
                       addresses.next_step(worker), True, Exit.NOT_READY)
    if _first(_RPC_MALFORMED, lines):
        return Failure("rpc", "a worker's address answers, but not as ggml-rpc-server does (another program on "
                       "its port, or a worker that crashed)", NOT_A_WORKER_HINT, True, Exit.NOT_READY)
    if hit := _first(_BIND, lines):
        return Failure("bind", f"llama-server could not listen: {hit[1]}",
                       "another program took the port: pass --port N", True, Exit.CONFLICT)
    if hit := _first(_OOM, lines):
        shown = "\n    ".join(clean(ln) for ln in lines if _OOM.search(ln) and not _NOISE.search(ln))[-1500:]
        return Failure("oom", f"llama-server ran out of memory:\n    {shown}", OOM_HINT, True)
    if hit := _first(_MODEL, lines):
        which = "drafter" if re.search(r"draft|speculative", hit[1], re.IGNORECASE) else "model"
        return Failure("model", f"llama-server could not load the {which}: {hit[1]}",
                       "check the file; `buun pull` / `buun convert` write it again", True, Exit.NOT_READY)
    return None


def summary(lines: Sequence[str], n_last: int = 12) -> str:
    """Known failure lines first (each once), then the other last lines (llama.cpp's chatter left
    out): what a failure message shows."""
    marked = list(dict.fromkeys(clean(ln) for ln in notable(lines)))[-8:]
    last = [c for c in (clean(ln) for ln in lines if not _NOISE.search(ln)) if c not in marked][-n_last:]
    parts = []
    if marked:
        parts.append("known failure lines:\n    " + "\n    ".join(marked))
    if last:
        parts.append(("other " if marked else "") + "last lines:\n    " + "\n    ".join(last))
    return "\n".join(parts)


# Causes whose message says all there is: their log lines would only repeat it.
_SELF_EXPLAINED = ("bad-flag", "bind", "exec", "rpc")


def exited_while_starting(reason: str) -> Failure:
    """An exit before ready with no known cause in the output ("llama-server exited with code 1")."""
    return Failure("crash", f"{reason} while starting", None, True)


def launch_error(failure: Failure, lines: Sequence[str], hint: str) -> BuunError:
    """What a user sees of a launch that never got ready, whoever launched it (the supervisor,
    `buun bench`, `buun fit --measure`): the cause and, unless the cause says it all, the lines of
    the output that show it; `hint` where the cause has none of its own."""
    message = failure.message
    if failure.kind not in _SELF_EXPLAINED and lines:
        message += "\n" + summary(lines, n_last=8)
    return BuunError(message, failure.hint or hint, failure.exit_code)
