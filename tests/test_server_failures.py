"""Launch failures the real tiny models cannot produce on demand (a load that stalls, an abort,
running out of GPU memory), through `buun start` with a scripted stand-in for llama-server that
prints what llama.cpp prints in those cases. Each cause must reach the user as its own error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from buun_tool.server.process import free_port
from tests.support.fixtures_server import ROOT, processes_with_env


@pytest.fixture
def fake_server(tmp_path: Path, isolated_dirs: Path):
    """Returns run(script_body) -> CompletedProcess of `buun start` with that script as llama-server."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    models = [tmp_path / "t.gguf", tmp_path / "d.gguf"]
    for m in models:
        m.write_bytes(b"GGUF")

    def run(body: str, *options: str) -> subprocess.CompletedProcess[str]:
        exe = bindir / "llama-server"
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(0o755)
        env = {**os.environ, "BUUN_LLAMA_BIN_DIR": str(bindir)}
        return subprocess.run([sys.executable, "-m", "buun_tool", "start", "--name", "fake", "--port",
                               str(free_port()), "--model", str(models[0]), "--draft", str(models[1]), *options],
                              capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)

    yield run
    left = processes_with_env("BUUN_STATE_DIR", str(isolated_dirs / "state"))
    for p in left:
        p.kill()
    assert not left, f"processes left: {[p.cmdline() for p in left]}"


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_load_that_stalls_times_out(fake_server) -> None:
    r = fake_server('echo "I srv    load_model: loading model \'$2\'"\nexec sleep 600\n', "--ready-timeout", "1")
    text = flat(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "did not become ready" in text and "no progress for 1 s" in text
    assert "(last: loading the target model)" in text and "--ready-timeout" in text


def test_an_abort_while_loading_shows_the_assert(fake_server) -> None:
    r = fake_server('echo "I srv    load_model: loading model"\n'
                    'echo "0.00.100.000 E /src/ggml.c:123: GGML_ASSERT(n_embd > 0) failed" >&2\nkill -ABRT $$\n')
    text = flat(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "llama-server was killed by SIGABRT while starting" in text
    assert "known failure lines: /src/ggml.c:123: GGML_ASSERT(n_embd > 0) failed" in text


def test_out_of_gpu_memory_suggests_smaller_settings(fake_server) -> None:
    r = fake_server(
        'echo "I load_tensors: offloading 65/65 layers to GPU"\n'
        'echo "E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: '
        'cudaMalloc failed: out of memory"\n'
        'echo "E llama_model_load: error loading model: unable to allocate CUDA0 buffer"\nexit 1\n')
    text = flat(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "llama-server ran out of memory" in text and "allocating 9216.00 MiB on device 0" in text
    assert "-c 4096" in text and "-ctk q8_0 -ctv q8_0" in text and "-ngl N" in text


def test_a_server_that_exits_at_once(fake_server) -> None:
    r = fake_server("exit 0\n")
    assert r.returncode == 1 and "llama-server exited with code 0 while starting" in flat(r.stderr)
