"""A host with several cards, faked: an nvidia-smi on PATH that answers buun's queries for the
cards given, and a llama-server stand-in whose build stamp says CUDA (or CPU)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

# (name, compute capability, MiB): a 3090 and a 4090, two archs
RTX_3090 = ("NVIDIA GeForce RTX 3090", "8.6", 24576)
RTX_4090 = ("NVIDIA GeForce RTX 4090", "8.9", 24564)
SERVER_PID = 4242  # the process the fake says holds memory on every card


def bus_id(index: int) -> str:
    return f"00000000:{index + 1:02X}:00.0"


def write_nvidia_smi(folder: Path, cards: Sequence[tuple[str, str, int]], used_mib: int = 1000) -> Path:
    """An nvidia-smi answering the queries of nvidia.detect_gpus, server/gpu.py and `buun status`."""
    rows = {
        "name,compute_cap,memory.total,driver_version": [f"{n}, {cap}, {mib}, 580.65" for n, cap, mib in cards],
        "index,memory.used,memory.total": [f"{i}, {used_mib}, {c[2]}" for i, c in enumerate(cards)],
        "index,pci.bus_id": [f"{i}, {bus_id(i)}" for i in range(len(cards))],
        "pid,used_memory": [f"{SERVER_PID}, {500 * len(cards)}"],
        "pid,gpu_bus_id,used_memory": [f"{SERVER_PID}, {bus_id(i)}, 500" for i in range(len(cards))],
    }
    answers = "".join(f"    --query-gpu={q}|--query-compute-apps={q}) printf '%s\\n' "
                      + " ".join(f"'{line}'" for line in lines) + "; exit 0 ;;\n" for q, lines in rows.items())
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nfor a in "$@"; do\n  case "$a" in\n{answers}  esac\ndone\nexit 0\n')
    smi.chmod(0o755)
    return smi


def fake_build(folder: Path, variant: str) -> Path:
    """A bin folder with a llama-server stand-in (never run) and the build stamp of `variant`."""
    bin_dir = folder / variant / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "llama-server").chmod(0o755)
    (folder / variant / "buun-build.json").write_text(json.dumps({"variant": variant, "arch": None}))
    return bin_dir


@pytest.fixture
def two_cards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nvidia-smi lists a 3090 (0) and a 4090 (1); llama-server is a CUDA build's."""
    write_nvidia_smi(tmp_path / "smi", [RTX_3090, RTX_4090])
    monkeypatch.setenv("PATH", f"{tmp_path / 'smi'}{os.pathsep}{os.environ['PATH']}")
    bin_dir = fake_build(tmp_path / "build", "cuda")
    monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(bin_dir))
    return bin_dir
