"""`buun fit --measure`: a real llama-server's buffers on this machine against the planner's
prediction (plan/fit.py), component by component. It starts a server, so it sits above the plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from buun_tool.base import command, console, nvidia
from buun_tool.base.command import Flag
from buun_tool.formats.recipes import Recipe
from buun_tool.measure import synth
from buun_tool.pipeline import build, patches
from buun_tool.plan.fit import FitFlags
from buun_tool.server import process
from buun_tool.server.local import LocalServer
from buun_tool.server.settings import ServerSettings

_BUFFER = re.compile(r"\s(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
# patch 0014's capture of the target's layers for the drafter, in a buffer of its own
_FEATURES = re.compile(r"set_layer_inp_device: \d+ layers x \d+ rows, ([\d.]+) MiB on (\S+)")


def parse_buffers(log: str) -> list[dict[str, dict[str, float]]]:
    """llama.cpp's buffer lines, one section per loaded model (target first, then the drafter):
    [{"model": {"CUDA0": MiB, ...}, "KV": {...}, "RS": {...}, "compute": {...}, "output": {...}}]."""
    sections: list[dict[str, dict[str, float]]] = []
    in_context = True
    for line in log.splitlines():
        m = _BUFFER.search(line)
        if not m:
            continue
        device, kind, mib = m.group(1), m.group(2), float(m.group(3))
        if kind == "model" and in_context:
            sections.append({})
            in_context = False
        elif kind != "model":
            in_context = True
        if not sections:
            sections.append({})
        bucket = sections[-1].setdefault(kind, {})
        # a compute buffer reserved again grows in place: the last (largest) size is the one held
        bucket[device] = max(bucket.get(device, 0.0), mib) if kind == "compute" else bucket.get(device, 0.0) + mib
    return sections


def is_gpu_buffer(device: str) -> bool:
    return not (device.startswith("CPU") or device.endswith("_Host"))


@dataclass
class Measurement:
    flags: FitFlags
    scale: str
    command: list[str]
    sections: list[dict[str, dict[str, float]]]
    gpu_used_mib: int | None  # nvidia-smi after load, minus before
    log_path: str
    components: dict[str, float] = field(default_factory=dict)  # MiB by prediction key
    # a split over several cards: llama.cpp's GPU buffers by device (CUDA0, ...; features included)
    # and nvidia-smi's used memory by card index, after load minus before
    per_device_mib: dict[str, float] = field(default_factory=dict)
    gpu_used_by_card: dict[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _component_mib(sections: list[dict[str, dict[str, float]]], gpu: bool) -> dict[str, float]:
    """The measured buffers under the prediction's keys (GPU buffers only when there is a GPU)."""
    def total(section: dict[str, dict[str, float]], kind: str) -> float:
        return sum(v for dev, v in section.get(kind, {}).items() if is_gpu_buffer(dev) or not gpu)

    out: dict[str, float] = {}
    names = (("target", ("weights", "model"), ("kv", "KV"), ("recurrent", "RS"), ("compute", "compute")),
             ("drafter", ("weights", "model"), ("kv", "KV"), ("compute", "compute")))
    for section, (role, *kinds) in zip(sections, names, strict=False):
        for key, kind in kinds:
            out["recurrent" if key == "recurrent" else f"{role}_{key}"] = total(section, kind)
    return out


def features_mib(log: str, gpu: bool) -> float | None:
    """The last size patch 0014's capture logged (None: no capture, AR or a build without it)."""
    found = [float(m.group(1)) for m in _FEATURES.finditer(log) if is_gpu_buffer(m.group(2)) or not gpu]
    return found[-1] if found else None


def measure_flags(f: FitFlags, cpu_only: bool) -> list[Flag]:
    """llama-server flags with the planner's settings, verbose enough (-lv 4) to print every
    buffer; upstream spellings, which the patched build knows too."""
    flags: list[Flag] = [
        ("-c", str(f.ctx)), ("-np", str(f.n_parallel)), ("-ngl", "99"), ("-fa", "on"), ("-ctk", f.cache_type_k),
        ("-ctv", f.cache_type_v), ("-b", str(f.batch)), ("-ub", str(f.ubatch)), ("--fit", "off"),
        ("--no-warmup", None), ("-lv", "4"), ("--no-webui", None)]
    if cpu_only:
        # weights in one mapped buffer (no repacked copy), and no AMX repack kernels, which fault on some VMs
        flags.append(("--no-repack", None))
    if f.spec:
        flags += [("-ngld", "99"), ("--spec-type", "draft-dflash"), ("--spec-draft-n-max", str(f.draft_max)),
                  ("-ctkd", f.draft_cache_type), ("-ctvd", f.draft_cache_type)]
        if f.draft_ctx:
            flags.append(("-cd", str(f.draft_ctx)))
        if f.tree:
            flags.append((command.TREE_BUDGET, str(f.tree_budget)))
    return flags


def supports_flag(binary: Path, flag: str) -> bool:
    """Whether this llama-server knows a flag (the pinned upstream has no -cd; buun's patch adds it)."""
    import subprocess

    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return re.search(rf"(^|[\s,]){re.escape(flag)}[\s,]", out.stdout + out.stderr, re.M) is not None


def device_mib(sections: list[dict[str, dict[str, float]]], log: str) -> dict[str, float]:
    """llama.cpp's GPU buffers by device, every model and kind together, with patch 0014's features."""
    out: dict[str, float] = {}
    for section in sections:
        for devices in section.values():
            for dev, mib in devices.items():
                if is_gpu_buffer(dev):
                    out[dev] = out.get(dev, 0.0) + mib
    last = {m.group(2): float(m.group(1)) for m in _FEATURES.finditer(log) if is_gpu_buffer(m.group(2))}
    for dev, mib in last.items():
        out[dev] = out.get(dev, 0.0) + mib
    return out


def measure(recipe: Recipe, flags: FitFlags, models_dir: Path, log_dir: Path, scale: str | None = None,
            load_timeout: float = 600.0, extra: list[Flag] | None = None,
            env: Mapping[str, str] | None = None) -> Measurement:
    """Load the recipe's synthetic pair in the real llama-server with these flags (and `extra`,
    in the environment `env`: a split's); read its buffer sizes and (with a GPU) nvidia-smi's used
    memory, by card."""
    on_gpu = bool(nvidia.detect_gpus())
    scale = scale or ("full" if on_gpu else "tiny")
    binary = build.find_binary("llama-server")
    if flags.spec and flags.draft_ctx and not supports_flag(binary, "-cd"):
        console.warn("this llama-server has no -cd: the drafter is measured at the target's context")
        flags = replace(flags, draft_ctx=None)
    target, drafter = synth.write_pair(recipe, models_dir, scale=scale)
    plan = ServerSettings([*measure_flags(flags, cpu_only=not on_gpu), *(extra or [])],
                          env={patches.ROLLBACK_ENV: flags.rollback, **(env or {})})
    launch = plan.render(binary, target, drafter if flags.spec else None, "127.0.0.1", process.free_port())
    argv = launch.argv
    log = log_dir / f"fit-measure-{scale}.log"
    before = nvidia.used_by_card() if on_gpu else None
    with LocalServer(argv, log, load_timeout, env=launch.env):
        after = nvidia.used_by_card() if on_gpu else None
    text = log.read_text(errors="replace")
    sections = parse_buffers(text)
    by_card = {i: mib - before.get(i, 0) for i, mib in after.items()} if after is not None and before is not None \
        else None
    used = sum(by_card.values()) if by_card is not None else None
    components = _component_mib(sections, on_gpu)
    captured = features_mib(text, on_gpu)
    if captured is not None:
        components["features"] = captured
    return Measurement(flags, scale, argv, sections, used, str(log), components, device_mib(sections, text), by_card)
