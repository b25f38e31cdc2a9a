"""GPU memory of a server, from nvidia-smi when it is there (None otherwise)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any


def parse_apps(text: str) -> dict[int, int]:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` -> {pid: MiB}."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = out.get(int(parts[0]), 0) + int(parts[1])
    return out


def parse_gpus(text: str) -> list[dict[str, int]]:
    """`--query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits` -> one dict per GPU."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            gpus.append({"index": int(parts[0]), "used_mib": int(parts[1]), "total_mib": int(parts[2])})
    return gpus


def _smi(*args: str, timeout: float = 10) -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def memory_for(pid: int, timeout: float = 10) -> dict[str, Any] | None:
    if not shutil.which("nvidia-smi"):
        return None
    apps = _smi("--query-compute-apps=pid,used_memory", timeout=timeout)
    gpus = _smi("--query-gpu=index,memory.used,memory.total", timeout=timeout)
    if apps is None and gpus is None:
        return None
    return {"server_mib": parse_apps(apps or "").get(pid), "gpus": parse_gpus(gpus or "")}
