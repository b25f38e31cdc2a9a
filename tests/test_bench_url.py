"""`buun bench --url` against a server that is not the llama-server it claims to be: a real HTTP
server on a thread, answering /health as llama-server does and its requests with what each test
names (a broken stream, an error, a redirect, a stream without end, bad timings). Each must be a
one-line error saying what the server did, soon, never a traceback or a bench that waits forever."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from buun_tool import bench
from buun_tool.errors import BuunError
from tests.bench_files import bench_cli, said

Answer = Callable[[BaseHTTPRequestHandler], None]
TIMINGS = {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 4, "predicted_ms": 40.0}


def _stream(*events: bytes, end: bool = True) -> Answer:
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


def _good() -> Answer:
    return _stream(b'{"content": "ab"}', json.dumps({"content": "", "timings": TIMINGS}).encode())


def _with_timings(**changed: object) -> Answer:
    return _stream(b'{"content": "ab"}', json.dumps({"content": "", "timings": {**TIMINGS, **changed}}).encode())


def _forever(head: bytes, piece: bytes, status: int = 200, pause: float = 0.0) -> Answer:
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


def _status(code: int, body: bytes = b"", **headers: str) -> Answer:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return answer


@contextmanager
def _server(answer: Answer, host: str = "127.0.0.1", metrics: Answer = _status(404)) -> Iterator[str]:
    """A server at the URL yielded: /health ok, /metrics `metrics`, every POST `answer`."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection does: a stream may never end

        def do_GET(self) -> None:
            get = {"/health": _status(200, b'{"status": "ok"}'), "/metrics": metrics}
            get.get(self.path, _status(404))(self)

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


def _bench(url: str, out: Path) -> tuple[int, str]:
    start = time.monotonic()
    res = bench_cli("--url", url, "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "4",
                    "--out", str(out))
    assert time.monotonic() - start < 10
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)  # no traceback
    return res.exit_code, said(res.output)


def test_a_server_that_answers_as_llama_server_does_is_measured(tmp_path: Path) -> None:
    """The hostile server's good answer: the bench runs, so each failure below is the answer's own."""
    with _server(_good()) as url:
        code, text = _bench(url, tmp_path)
    assert code == 0, text
    row = json.loads((tmp_path / "bench.json").read_text())["summary"][0]
    assert row["decode_tps"] == 100.0 and row["requests"] == 1


@pytest.mark.parametrize("answer, message", [
    (_stream(b"{oops"), "streamed an event that is not JSON: '{oops'"),
    (_stream(b"\xff\xfe"), "streamed an event that is not JSON: '\ufffd\ufffd'"),
    (_stream(b"[1, 2]"), "streamed an event that is not a JSON object: '[1, 2]'"),
    (_stream(b'{"timings": 5}'), "streamed timings that are not a JSON object: 5"),
    (_stream(b'{"choices": 5, "content": "x"}'), "streamed no timings"),
    (_with_timings(predicted_n=-5), "streamed timings with predicted_n -5: expected a count of tokens, 0 or more"),
    (_with_timings(predicted_n="4"), 'streamed timings with predicted_n "4": expected a count of tokens'),
    (_with_timings(predicted_ms=float("nan")), "streamed timings with predicted_ms NaN: expected milliseconds"),
    (_with_timings(prompt_ms=-1.0), "streamed timings with prompt_ms -1.0: expected milliseconds, 0 or more"),
    (_with_timings(predicted_ms=0), "streamed timings of 4 tokens decoded in 0 ms"),
    (_forever(b"", b'data: {"content": "x"}\n\n'), "streamed more than 72 events for a request of 4 tokens"),
    (_forever(b"data: ", b"x" * 65536), "streamed a line of more than 1 MiB"),
    (_forever(b"\xff broken", b"x" * 4096, status=500), "answered HTTP 500: \ufffd brokenxxx"),
], ids=["not json", "not utf-8", "not an object", "timings", "choices", "negative count", "string count",
        "nan time", "negative time", "no time", "endless stream", "endless line", "endless error"])
def test_an_answer_that_is_not_llama_servers_is_named(tmp_path: Path, answer: Answer, message: str) -> None:
    """Before: a JSONDecodeError, TypeError or AttributeError traceback; NaN, negative or string
    timings written into bench.json as a speed; a stream or an error body without end read forever."""
    with _server(answer) as url:
        code, text = _bench(url, tmp_path)
    assert code == 1 and message in text, text
    assert "is this a llama-server?" in text or "HTTP 500" in text


def test_metrics_that_count_nothing_are_not_a_traceback(tmp_path: Path) -> None:
    """Before: a NaN counter in /metrics was a ValueError traceback (int() of NaN) at the first reading."""
    text = (b"llamacpp:spec_decode_num_draft_tokens_total NaN\nllamacpp:spec_decode_num_accepted_tokens_total +Inf\n"
            b"llamacpp:spec_decode_num_drafts_total -3\n")
    with _server(_good(), metrics=_status(200, text)) as url:
        code, text_ = _bench(url, tmp_path)
    assert code == 0, text_
    sample = json.loads((tmp_path / "bench.json").read_text())["samples"][0]
    assert sample["steps"] is None and sample["drafted"] == 0  # no verify steps known: none made up


def test_a_redirect_to_another_host_is_not_followed(tmp_path: Path) -> None:
    """Before: requests followed it, and the bench measured the other host as the one at --url."""
    with _server(_good(), host="127.0.0.2") as other:
        with _server(_status(307, Location=f"{other}/completion")) as url:
            code, text = _bench(url, tmp_path)
    assert code == 1 and f"{url}/completion answered HTTP 307, a redirect to {other}/completion" in text, text
    assert "follows no redirect" in text


def test_a_proxy_of_the_environment_is_not_in_between(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the requests went through HTTP_PROXY while the /health before them went to --url."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with _server(_status(502, b"the proxy"), host="127.0.0.2") as proxy, _server(_good()) as url:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("http_proxy", proxy)
        code, text = _bench(url, tmp_path)
    assert code == 0, text


def test_a_server_that_trickles_its_stream_is_given_up_on(tmp_path: Path) -> None:
    """requests' timeout is per read: a byte every 0.1 s kept a request going for ever."""
    prompt = bench.Prompt("math", "m", "2+2?")
    with _server(_forever(b"data: ", b"x", pause=0.1)) as url:
        start = time.monotonic()
        with pytest.raises(BuunError, match=r"/completion took more than 1.5 s for one request of 4 tokens"):
            bench.send(url, prompt, "raw", 4, seed=1, timeout=1.5)
        assert time.monotonic() - start < 3
    assert bench.request_timeout(256) == 856.0  # 10 minutes and a second a token
