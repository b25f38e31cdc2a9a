"""A stand-in llama-server for the supervisor's tests: it takes llama-server's argv, prints a
loading line, then answers /health on --host/--port within a fraction of a second and logs each
request to stdout as llama-server does. The real server needs seconds to load even the tiny models;
the supervision around it does not depend on what it serves.

FAKE_LLAMA_SPAM=1: a thread also prints a 200-byte line every millisecond (a busy server's log),
so a reader that stops reading its output blocks it within a moment, as it would llama-server.

Run as llama-server by `write_fake_bin` (a script in BUUN_LLAMA_BIN_DIR)."""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time
from pathlib import Path


def write_fake_bin(folder: Path) -> Path:
    """`folder`/llama-server: this module's text run by this test's Python (its command line names
    llama-server, as buun's checks of a live server expect)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text())
    exe.chmod(0o755)
    return exe


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b'{"status":"ok"}' if self.path == "/health" else b"{}"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
        print(f"srv  log_server_r: request: GET {self.path} 200", flush=True)


def _spam() -> None:
    i = 0
    while True:
        i += 1
        print(f"slot update_slots: line {i} " + "x" * 200, flush=True)
        time.sleep(0.001)


def main(argv: list[str]) -> None:
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    port = int(argv[argv.index("--port") + 1])
    print("srv    load_model: loading model", flush=True)
    server = http.server.ThreadingHTTPServer((host, port), _Handler)
    print(f"main: server is listening on http://{host}:{port}", flush=True)
    if os.environ.get("FAKE_LLAMA_SPAM"):
        threading.Thread(target=_spam, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
