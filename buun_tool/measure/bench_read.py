"""A recorded `buun bench` run read back: bench.json's format, and every field the report and
--compare read checked to be of its kind, so that a file from anyone is one line saying what is
wrong, never a traceback far from the field that caused it.

    read_json(path) -> dict      a recorded run (this format or an earlier one), checked
    in_range(value) -> bool      a number from 0 to LARGEST (the server's timings are held to it too)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buun_tool.base.errors import UsageError

# bench.json's layout. 1 (no "format" key): the runs before the HTML report, without the prompts'
# text and the bandwidth figures; 2 adds "format", "prompts" and "limits".
FORMAT = 2


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
                                 "vs_upstream", "step_ms", "aggregate_tps", "vs_one_slot", "vs_ar", "served_tps",
                                 "served_vs_one_slot"), "number?")},
    "samples": {"config": "text", "suite": "text", "mode": "text", "prompt_id": "text", "repeat": "count",
                "decode_tokens": "count", "decode_ms": "number", "wall_ms": "number?"},
    "configs": {"name": "text", "label": "text", "spec": "bool", "synthetic_al": "number?", "expected_al": "number?",
                "tree_budget": "count?", "peak_gpu_mib": "count?", "baseline_gpu_mib": "count?", "argv": "texts?"},
    "prompts": {"suite": "text", "id": "text", "text": "text"},
    "machine.gpus": {"name": "text"},
}
_LIMIT_KINDS = {"bandwidth_gbs": "positive?", "target_bytes": "positive?", "drafter_bytes": "number?"}


def in_range(v: Any) -> bool:
    # NaN fails both comparisons; a huge int is compared exactly, never converted
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= LARGEST


_CHECKS: dict[str, tuple[Any, str]] = {
    "text": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and in_range(v), f"a whole number from 0 to {_UP_TO}"),
    "number": (in_range, f"a number from 0 to {_UP_TO}"),
    "positive": (lambda v: in_range(v) and v > 0, f"a number above 0, up to {_UP_TO}"),
    "numbers": (lambda v: isinstance(v, list) and all(map(in_range, v)), f"a list of numbers from 0 to {_UP_TO}"),
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
