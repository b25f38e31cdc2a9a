"""What a `buun bench` run records beside its figures: the machine, the llama.cpp pin and builds,
the options it ran with, and what the report's bandwidth bound needs.

    machine_info() -> dict                  the cards, driver, CPU, memory, OS
    llama_cpp_info(upstream) -> dict        the pin, buun's build stamp and version (and upstream's)
    limits(opts, machine) -> dict           the card's memory bandwidth and the weights a step reads
    recorded_options(opts) -> dict          the options as bench.json records them
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import psutil

from buun_tool.base import cmdline, nvidia, paths
from buun_tool.base.errors import BuunError, NotReadyError
from buun_tool.measure.bench_run import BenchOptions
from buun_tool.pipeline import build, patches, vendor


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


def recorded_options(opts: BenchOptions) -> dict[str, Any]:
    """The options as bench.json records them (each configuration's own are in its "configs" entry),
    with the servers' environment: the patch series' switches and the cards they ran with."""
    skip = ("recipe", "configs", "overrides", "workers", "tuned")
    out: dict[str, Any] = {f.name: getattr(opts, f.name) for f in fields(opts) if f.name not in skip}
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}
    if opts.workers:
        out["workers"] = {"rpc": [str(e) for e in opts.workers.endpoints], "draft_device": opts.workers.draft_device}
    out["recipe"] = str(opts.recipe.source) if opts.recipe else None
    out["url"] = cmdline.without_password(opts.url) if opts.url else None
    out["overrides"] = opts.overrides.to_json()  # the bench command line's, applied to every server
    out["tuned"] = opts.tuned.note if opts.tuned else None  # under the command line's, for DFlash's servers
    if not opts.url:  # the patch series' switches and the cards the servers ran with
        out["env"] = {k: os.environ[k] for k in patches.SWITCHES if k in os.environ}
        out["env"].update(opts.where.env if opts.where else {})
    return out
