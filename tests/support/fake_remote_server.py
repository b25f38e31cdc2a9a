"""A tiny HTTP server on a thread that answers as a test tells it: llama-server's /health, and for
/metrics, /slots, /props and every POST what the test names (a good stream, a broken one, an error,
a redirect, a body without end). Real HTTP, for the readers of a server someone else runs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[BaseHTTPRequestHandler], None]
TIMINGS = {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 4, "predicted_ms": 40.0}


def stream(*events: bytes, end: bool = True) -> Answer:
    """A 200 event stream of these `data:` payloads (then [DONE] with `end`)."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for e in events:
            h.wfile.write(b"data: " + e + b"\n\n")
        if end:
            h.wfile.write(b"data: [DONE]\n\n")
    return answer


def good() -> Answer:
    return stream(b'{"content": "ab"}', json.dumps({"content": "", "timings": TIMINGS}).encode())


def with_timings(**changed: object) -> Answer:
    return stream(b'{"content": "ab"}', json.dumps({"content": "", "timings": {**TIMINGS, **changed}}).encode())


def forever(head: bytes, piece: bytes, status: int = 200, pause: float = 0.0) -> Answer:
    """`head`, then `piece` again and again (every `pause` s) until the client goes away."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(head)
        try:
            while True:
                h.wfile.write(piece)
                h.wfile.flush()
                time.sleep(pause)
        except OSError:  # the client closed the connection
            pass
    return answer


def trickled_head(gone: threading.Event, pause: float = 0.05) -> Answer:
    """A status line, then one header a byte every `pause` s, never ended: `gone` is set once the
    client has closed the connection (a write fails)."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        try:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while True:
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(pause)
        except OSError:
            gone.set()
    return answer


def status(code: int, body: bytes = b"", **headers: str) -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return answer


@contextmanager
def serve(answer: Answer, host: str = "127.0.0.1", metrics: Answer | None = None, **gets: Answer) -> Iterator[str]:
    """A server at the URL yielded: /health ok, /metrics `metrics`, /NAME gets[NAME] (else 404),
    every POST `answer`."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection does: a stream may never end

        def do_GET(self) -> None:
            get = {"/health": status(200, b'{"status": "ok"}'), "/metrics": metrics,
                   **{f"/{name}": a for name, a in gets.items()}}
            (get.get(self.path) or status(404))(self)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            answer(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
