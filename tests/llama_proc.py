"""Test plumbing: run a real llama-server on a free loopback port and talk to it.

No supervisor: the correctness harness tests llama.cpp itself, and buun's supervisor has its own
tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from buun_tool.server import command, process
from buun_tool.server.local import LocalServer

__all__ = ["Server", "gpu_layers", "llama_server"]


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
    """A llama-server of the build under test on a free loopback port (`args` name the models with
    -m / -md), built and run as `buun bench` builds and runs its servers: command.server_argv,
    server.local.LocalServer (process group, /health wait, SIGTERM then SIGKILL)."""
    target, draft, flags = command.take_models(command.parse_args(args))
    argv = command.server_argv(str(bin_dir / "llama-server"), target, draft, "127.0.0.1", process.free_port(), flags)
    with LocalServer(argv, log, load_timeout=ready_timeout) as local:
        yield Server(local.url, log)
