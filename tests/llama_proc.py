"""Test plumbing: run a real llama-server on a free loopback port and talk to it.

Deliberately plain (no supervisor): the correctness harness must test llama.cpp itself, and
buun's supervisor has its own tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_layers() -> list[str]:
    """`-ngl 99 -ngld 99` when the harness runs against a GPU build (BUUN_TEST_NGL=99)."""
    n = os.environ.get("BUUN_TEST_NGL")
    return ["-ngl", n, "-ngld", n] if n else []


class Server:
    def __init__(self, url: str, log: Path):
        self.url = url
        self.log = log

    def post(self, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        r = requests.post(self.url + path, json=body, timeout=timeout)
        assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.text[:500]}\n{self.log_tail()}"
        return r.json()

    def complete(self, prompt: list[int] | str, n_predict: int, **extra: Any) -> dict[str, Any]:
        """Greedy completion, token ids back."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 1,
                "ignore_eos": True, "return_tokens": True, "cache_prompt": False, **extra}
        return self.post("/completion", body)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


@contextmanager
def llama_server(bin_dir: Path, args: list[str], log: Path, ready_timeout: float = 120) -> Iterator[Server]:
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), *args, "--host", "127.0.0.1", "--port", str(port), "--metrics"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"llama-server exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                if requests.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"llama-server not ready after {ready_timeout} s:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
