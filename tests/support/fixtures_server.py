"""The server tests' plumbing: a pytest plugin, and helpers the tests import.

Helpers: `buun` as a subprocess in a test's own folders (`Buun`, `run_buun`), the test-only
llama-server flags, waiting on an instance's record, finding every process a test started, chat
requests. Fixtures: `buun` serves the tiny pair (`tiny_pair`, tests/support/fixtures_models.py) with
the CPU build's llama-server and, even when the test fails, ends every process it started (each test
has its own BUUN_STATE_DIR, every process buun starts inherits it, and a scan of the process table
finds them all); `compat_args` fits the recipe's flags to an unpatched llama-server; `fake_bin` is a
llama-server that is never run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import requests

from buun_tool.base import command
from buun_tool.formats import recipes
from buun_tool.measure.bench_configs import UPSTREAM

ROOT = Path(__file__).resolve().parents[2]

# Test-only llama-server flags. -nr: a -march=native CPU build on a VM whose CPU lists AMX but
# whose hypervisor does not enable it dies with "Illegal instruction" at the first decode (seen on
# this project's CI machine); without weight repacking the AMX kernels are not used.
# -t 1: on a small, busy CI box two spinning threads make a tiny model 10x slower.
# --fit off, --no-warmup: skip the memory-fitting pass and the warm-up decode (load in half the time).
TEST_FLAGS = ("-nr", "-t", "1", "--fit", "off", "--no-warmup")


# Fast supervision for tests: quick relaunches and health checks.
FAST = ["--backoff", "0.2", "--backoff-max", "1", "--health-interval", "0.5", "--health-timeout", "1",
        "--stop-timeout", "5", "--ready-timeout", "30"]


def run_buun(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
             check: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m buun_tool ARGS` from the checkout, in `env` (default: this process's); `check`: a
    non-zero exit fails the test with both outputs."""
    r = subprocess.run([sys.executable, "-m", "buun_tool", *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=ROOT)
    if check and r.returncode != 0:
        raise AssertionError(f"buun {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


class Buun:
    """`python -m buun_tool ...` in this test's isolated folders."""

    def __init__(self, state_dir: Path, pair: tuple[Path, Path], compat: list[str]):
        self.state_dir, self.pair, self.compat = state_dir, pair, compat

    def __call__(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        return run_buun(*args, env={**os.environ, **(env or {})}, timeout=timeout, check=check)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "buun_tool", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)

    def launch_args(self, name: str, port: int, *options: str, extra: tuple[str, ...] = ()) -> list[str]:
        """Options for serve/start: the tiny pair, the port, fast supervision, upstream compat."""
        target, draft = self.pair
        compat = list(self.compat)
        tail: list[str] = []
        if "--" in compat:
            i = compat.index("--")
            compat, tail = compat[:i], compat[i + 1:]
        tail += list(extra)
        return ["--name", name, "--port", str(port), "--model", str(target), "--draft", str(draft),
                *FAST, *compat, *options, *(["--", *tail] if tail else [])]

    def start(self, name: str, port: int, *options: str, extra: tuple[str, ...] = (),
              check: bool = True) -> subprocess.CompletedProcess[str]:
        return self("start", *self.launch_args(name, port, *options, extra=extra), check=check)

    def status(self, name: str, env: dict[str, str] | None = None) -> dict:
        r = self("status", name, "--json", env=env, check=True)
        return json.loads(r.stdout)

    def record(self, name: str) -> dict:
        return json.loads((self.state_dir / "instances" / name / "state.json").read_text())

    def wait_state(self, name: str, cond: Callable[[dict], bool], timeout: float = 60) -> dict:
        return wait_record(lambda: self.record(name), cond, name, timeout)

    def ours(self) -> list[psutil.Process]:
        """Every live process started under this test's state dir (buun's and llama-server)."""
        return processes_with_env("BUUN_STATE_DIR", str(self.state_dir))


def processes_with_env(key: str, value: str) -> list[psutil.Process]:
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in me:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(key) == value:
                found.append(p)
        except psutil.Error:
            continue
    return found


def chat(port: int, text: str = "Hello", stream: bool = False, api_key: str | None = None,
         max_tokens: int = 4) -> requests.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    s = requests.Session()
    s.trust_env = False
    return s.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=headers, stream=stream, timeout=60,
                  json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                        "temperature": 0, "stream": stream})


def wait_record(read: Callable[[], dict], cond: Callable[[dict], bool], what: str, timeout: float) -> dict:
    """The state record `read` gives once `cond` holds for it (a record being rewritten or not yet
    written is read again)."""
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        try:
            last = read()
            if cond(last):
                return last
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting on {what}; last record: {json.dumps(last, indent=1)}")


@pytest.fixture(scope="session")
def compat_args(llama_bin: Path) -> list[str]:
    """buun options that make the recipe's flags run on a llama-server without the compatibility
    patch (pinned upstream): `buun bench`'s upstream set (bench_configs.UPSTREAM) as `buun serve`
    arguments; empty with the patch: the recipe's flags are then used unchanged. The recipe flags
    it touches are tried for real: `llama-server FLAG VALUE --help` fails on an unknown one."""
    def accepted(flag: str, value: str | None) -> bool:
        r = subprocess.run([str(llama_bin / "llama-server"), flag, *([value] if value else []), "--help"],
                           capture_output=True, timeout=60)
        return r.returncode == 0

    base = command.recipe_flags(recipes.load().server_flags)
    touched = {command.canonical(n) for (n, _), _ in UPSTREAM.respell} | {command.canonical(d) for d in UPSTREAM.drop}
    if all(accepted(n, v) for n, v in base if command.canonical(n) in touched):
        return []
    sets, drops = UPSTREAM.serve_args(base)
    return [f"--drop={d}" for d in drops] + ["--", *(t for n, v in sets for t in (n, *([v] if v else [])))]


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in llama-server (BUUN_LLAMA_BIN_DIR) for what needs only its path and never runs
    it (`buun serve --print-cmd`, a bench configuration's argv)."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "llama-server").write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(d))
    return d


@pytest.fixture
def buun(isolated_dirs: Path, tiny_pair: tuple[Path, Path], compat_args: list[str]) -> Iterator[Buun]:
    b = Buun(isolated_dirs / "state", tiny_pair, compat_args)
    try:
        yield b
    finally:
        left = b.ours()
        for p in left:  # a failed test may leave some: no test leaks processes into the next
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=5)
