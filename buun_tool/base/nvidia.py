"""The machine's NVIDIA cards, as nvidia-smi reports them: which there are (detect_gpus: what the
build compiles for, what fit plans on, what doctor checks) and their memory, when nvidia-smi is
there (None otherwise): a server's own (`buun status`), the cards' used memory (`buun fit
--measure`) and its peak over a run (`buun bench`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from buun_tool.base.command import is_count


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str  # "8.6"
    memory_mib: int
    driver: str
    index: int = 0  # nvidia-smi's (PCI bus order): what `--gpus` and CUDA_VISIBLE_DEVICES name

    @property
    def arch(self) -> str:
        return self.compute_cap.replace(".", "")

    @property
    def cc(self) -> tuple[int, int]:
        major, _, minor = self.compute_cap.partition(".")
        return int(major), int(minor)


def detect_gpus() -> list[Gpu]:
    """GPUs visible through nvidia-smi, every card, in its index order (the order it lists them
    in); empty when there is none (or no driver)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append(Gpu(parts[0], parts[1], int(float(parts[2])), parts[3], len(gpus)))
    return gpus


def listed_gpus() -> int:
    """How many GPUs `nvidia-smi -L` lists: where detect_gpus finds none, a driver too old for its
    query (no compute_cap field) still lists them."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0

def parse_apps(text: str) -> dict[int, int]:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` -> {pid: MiB}."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and is_count(parts[0]) and is_count(parts[1]):
            out[int(parts[0])] = out.get(int(parts[0]), 0) + int(parts[1])
    return out


def parse_gpus(text: str) -> list[dict[str, int]]:
    """`--query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits` -> one dict per GPU."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(is_count(p) for p in parts):
            gpus.append({"index": int(parts[0]), "used_mib": int(parts[1]), "total_mib": int(parts[2])})
    return gpus


def _smi(*args: str, timeout: float = 10) -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def _gpus(timeout: float) -> list[dict[str, int]] | None:
    if not shutil.which("nvidia-smi"):
        return None
    text = _smi("--query-gpu=index,memory.used,memory.total", timeout=timeout)
    return None if text is None else parse_gpus(text)


def used_mib(timeout: float = 10) -> int | None:
    """`memory.used` of every GPU, summed (MiB); None without nvidia-smi or a GPU it can read."""
    gpus = _gpus(timeout)
    return sum(g["used_mib"] for g in gpus) if gpus else None


def used_by_card(timeout: float = 10) -> dict[int, int] | None:
    """`memory.used` of each GPU by nvidia-smi index (MiB); None without nvidia-smi or a GPU it can read."""
    gpus = _gpus(timeout)
    return {g["index"]: g["used_mib"] for g in gpus} if gpus else None


def parse_bus_apps(apps: str, cards: str) -> dict[int, dict[int, int]]:
    """`--query-compute-apps=pid,gpu_bus_id,used_memory` and `--query-gpu=index,pci.bus_id` ->
    {pid: {card index: MiB}}: what each process holds on each card."""
    index = {}
    for line in cards.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and is_count(parts[0]):
            index[parts[1].lower()] = int(parts[0])
    out: dict[int, dict[int, int]] = {}
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and is_count(parts[0]) and is_count(parts[2]) and parts[1].lower() in index:
            per = out.setdefault(int(parts[0]), {})
            card = index[parts[1].lower()]
            per[card] = per.get(card, 0) + int(parts[2])
    return out


@dataclass(frozen=True)
class ServerMemory:
    """What nvidia-smi says of one process's GPU memory: `buun status`'s GPU row."""

    server_mib: int | None  # the process's, every card together
    gpus: list[dict[str, int]]  # each card: index, used_mib, total_mib
    server_by_gpu: dict[str, int]  # the process's on each card, by nvidia-smi index

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def memory_for(pid: int, timeout: float = 10) -> ServerMemory | None:
    if not shutil.which("nvidia-smi"):
        return None
    apps = _smi("--query-compute-apps=pid,used_memory", timeout=timeout)
    gpus = _gpus(timeout)
    if apps is None and gpus is None:
        return None
    server_mib = parse_apps(apps or "").get(pid)
    if gpus and len(gpus) == 1:  # one card holds it all: no need to ask nvidia-smi twice more
        mine = {gpus[0]["index"]: server_mib} if server_mib is not None else {}
    else:
        by_card = _smi("--query-compute-apps=pid,gpu_bus_id,used_memory", timeout=timeout)
        cards = _smi("--query-gpu=index,pci.bus_id", timeout=timeout)
        mine = parse_bus_apps(by_card or "", cards or "").get(pid, {})
    return ServerMemory(server_mib, gpus or [], {str(i): mib for i, mib in sorted(mine.items())})


class MemorySampler:
    """Peak `used_mib()` while it runs (`with MemorySampler() as mem: ...; mem.peak`), sampled
    every `interval` s on a thread of its own; `baseline` is the reading before. Inert (both
    None) on a machine where nvidia-smi reads no GPU."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.samples: deque[int] = deque(maxlen=100_000)
        self.baseline: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self.baseline = used_mib()
        if self.baseline is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="gpu-memory")
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            v = used_mib()
            if v is not None:
                self.samples.append(v)
            self._stop.wait(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=15)

    @property
    def peak(self) -> int | None:
        return max(self.samples) if self.samples else None
