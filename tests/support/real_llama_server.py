"""Test plumbing: run a real llama-server on a free loopback port and talk to it.

No supervisor: the correctness harness tests llama.cpp itself, and buun's supervisor has its own
tests.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from buun_tool.base import command
from buun_tool.server import process
from buun_tool.server.local import LocalServer
from tests.support import waits

__all__ = ["Server", "concurrently", "gpu_layers", "llama_server", "placement", "stream_then_close"]


def gpu_layers() -> list[str]:
    """`-ngl 99 -ngld 99` when the harness runs against a GPU build (BUUN_TEST_NGL=99)."""
    n = os.environ.get("BUUN_TEST_NGL")
    return ["-ngl", n, "-ngld", n] if n else []


def placement(args: list[str]) -> list[str]:
    """Where a DFlash server of the harness puts the models: BUUN_TEST_DEVICE_ARGS, which the GPU
    driver sets to run the same checks with the target split over two cards (`-sm layer -dev
    CUDA0,CUDA1 -devd CUDA1`) or with a card behind an RPC worker (`--rpc HOST:PORT`). Servers
    without a drafter, the AR references, stay on the local device: a ggml-rpc-server serves one
    client at a time, so a reference beside the server under test would wait for it forever."""
    return shlex.split(os.environ.get("BUUN_TEST_DEVICE_ARGS", "")) if "-md" in args else []


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
    target, draft, flags = command.take_models(command.parse_args([*args, *placement(args)]))
    argv = command.server_argv(str(bin_dir / "llama-server"), target, draft, "127.0.0.1", process.free_port(), flags)
    with LocalServer(argv, log, load_timeout=ready_timeout) as local:
        yield Server(local.url, log)


def concurrently(calls: list[Callable[[], Any]], stagger: float = 0.0,
                 after_first: tuple[Callable[[], object], str] | None = None) -> list[Any]:
    """Run each call on a thread of its own (call i starts i * stagger seconds after the first, or,
    with `after_first` = (condition, what), once the condition holds: a state the first call has
    reached, however fast the machine); their results in order. An exception in a call fails the
    test with it."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            if i and after_first:
                waits.until(after_first[0], 120, after_first[1])
            time.sleep(i * stagger)
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def stream_then_close(server: Server, events: int, timeout: float = 300, **body: Any) -> int:
    """Start a streamed /completion (`body`: its fields; 400 tokens past EOS unless it says
    otherwise) and close the connection after `events` events, mid-generation (the server then
    cancels the task); the events read."""
    body = {"n_predict": 400, "ignore_eos": True, "stream": True, "cache_prompt": True, **body}
    n = 0
    with requests.post(server.url + "/completion", json=body, stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text[:300]
        for line in r.iter_lines():
            n += line.startswith(b"data:")
            if n >= events:
                break
    return n
