"""server.local.LocalServer, the launcher of `buun bench`, `buun fit --measure` and the tests'
servers, driven with a scripted stand-in for llama-server: readiness, the stop flow, and failures
reported as the supervisor reports them."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from buun_tool.base import command
from buun_tool.base.errors import BuunError, Exit
from buun_tool.server import loglines, process
from buun_tool.server.local import LocalServer

# Answers /health once "loaded"; `crash` prints what a missing GGUF prints, `bad-flag` what an
# unknown flag prints; `stubborn` ignores SIGTERM; every mode but the failures starts a child.
FAKE_SERVER = textwrap.dedent("""\
    import http.server, signal, subprocess, sys
    mode, port = sys.argv[1], int(sys.argv[sys.argv.index("--port") + 1])
    print("load_model: loading model 'x.gguf'", flush=True)
    if mode == "crash":
        print("error: failed to open GGUF file 'x.gguf'", flush=True)
        sys.exit(3)
    if mode == "bad-flag":
        print("error: invalid argument: --draft-max", flush=True)
        sys.exit(1)
    if mode == "stall":
        signal.pause()
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "300"])
    print(f"child {child.pid}", flush=True)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _server(tmp_path: Path, mode: str, **kwargs) -> LocalServer:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    # the argv every launcher builds: command.server_argv, here with the script as its "binary"
    argv = command.server_argv(sys.executable, str(script), None, "127.0.0.1", process.free_port(), [])
    argv[1:3] = [str(script), mode]  # python SCRIPT MODE ... instead of BINARY -m TARGET
    return LocalServer(argv, tmp_path / f"{mode}.log", **{"load_timeout": 30, "grace": 0.5, **kwargs})


def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    server = _server(tmp_path, "stubborn")
    with server:
        assert server.proc is not None and server.url == f"http://127.0.0.1:{server.port}"
        pid = server.proc.pid
        child = int(next(ln for ln in server.lines() if ln.startswith("child")).split()[1])
        assert not _gone(child)
    assert _gone(pid) and _gone(child) and _port_closed(server.port)
    log = server.log_path.read_text()
    assert log.startswith("$ ") and "--port" in log.splitlines()[0] and f"child {child}" in log


def test_an_early_exit_is_diagnosed_as_the_supervisor_does(tmp_path: Path) -> None:
    with pytest.raises(BuunError) as info:
        _server(tmp_path, "crash").start()
    lines = ["load_model: loading model 'x.gguf'", "error: failed to open GGUF file 'x.gguf'"]
    failure = loglines.diagnose(lines)
    assert failure is not None and info.value.message.startswith(failure.message)
    assert "could not load the model" in info.value.message and info.value.exit_code == Exit.NOT_READY


def test_a_flag_from_the_recipe_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(BuunError) as info:
        _server(tmp_path, "bad-flag", recipe_flags=["--draft-max"]).start()
    assert info.value.message == "llama-server does not know the flag --draft-max"
    assert "comes from the recipe" in (info.value.hint or "") and info.value.exit_code == Exit.USAGE


def test_a_load_that_never_ends_times_out_with_its_phase(tmp_path: Path) -> None:
    server = _server(tmp_path, "stall", load_timeout=1.0)
    with pytest.raises(BuunError, match=r"not ready after 1 s \(last: loading the target model\)") as info:
        server.start()
    assert "--load-timeout" in (info.value.hint or "")
    assert server.proc is not None and _gone(server.proc.pid)


def test_a_missing_binary_says_to_build(tmp_path: Path) -> None:
    argv = command.server_argv(str(tmp_path / "llama-server"), "t.gguf", None, "127.0.0.1", process.free_port(), [])
    with pytest.raises(BuunError, match="cannot run") as info:
        LocalServer(argv, tmp_path / "x.log").start()
    assert info.value.hint == "run `buun build`"
