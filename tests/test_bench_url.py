"""`buun bench --url` against a server that is not the llama-server it claims to be: a real HTTP
server on a thread, answering /health as llama-server does and its requests with what each test
names (a broken stream, an error, a redirect, a stream without end, bad timings). Each must be a
one-line error saying what the server did, soon, never a traceback or a bench that waits forever."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from buun_tool.base.errors import BuunError
from buun_tool.measure import bench
from buun_tool.server.health import Probe
from tests.support.fake_remote_server import Answer, forever, good, serve, status, stream, trickled_head, with_timings
from tests.support.recorded_bench import bench_cli, said


def _bench(url: str, out: Path) -> tuple[int, str]:
    start = time.monotonic()
    res = bench_cli("--url", url, "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "4",
                    "--out", str(out))
    assert time.monotonic() - start < 10
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)  # no traceback
    return res.exit_code, said(res.output)


def test_a_server_that_answers_as_llama_server_does_is_measured(tmp_path: Path) -> None:
    """The hostile server's good answer: the bench runs, so each failure below is the answer's own."""
    with serve(good()) as url:
        code, text = _bench(url, tmp_path)
    assert code == 0, text
    row = json.loads((tmp_path / "bench.json").read_text())["summary"][0]
    assert row["decode_tps"] == 100.0 and row["requests"] == 1


@pytest.mark.parametrize("answer, message", [
    (stream(b"{oops"), "streamed an event that is not JSON: '{oops'"),
    (stream(b"\xff\xfe"), "streamed an event that is not JSON: '\ufffd\ufffd'"),
    (stream(b"[1, 2]"), "streamed an event that is not a JSON object: '[1, 2]'"),
    (stream(b'{"timings": 5}'), "streamed timings that are not a JSON object: 5"),
    (stream(b'{"choices": 5, "content": "x"}'), "streamed no timings"),
    (with_timings(predicted_n=-5), "streamed timings with predicted_n -5: expected a count of tokens, 0 or more"),
    (with_timings(predicted_n="4"), 'streamed timings with predicted_n "4": expected a count of tokens'),
    (with_timings(predicted_ms=float("nan")), "streamed timings with predicted_ms NaN: expected milliseconds"),
    (with_timings(prompt_ms=-1.0), "streamed timings with prompt_ms -1.0: expected milliseconds, 0 or more"),
    (with_timings(predicted_ms=0), "streamed timings of 4 tokens decoded in 0 ms"),
    (forever(b"", b'data: {"content": "x"}\n\n'), "streamed more than 72 events for a request of 4 tokens"),
    (forever(b"data: ", b"x" * 65536), "streamed a line of more than 1 MiB"),
    (forever(b"\xff broken", b"x" * 4096, status=500), "answered HTTP 500: \ufffd brokenxxx"),
], ids=["not json", "not utf-8", "not an object", "timings", "choices", "negative count", "string count",
        "nan time", "negative time", "no time", "endless stream", "endless line", "endless error"])
def test_an_answer_that_is_not_llama_servers_is_named(tmp_path: Path, answer: Answer, message: str) -> None:
    """Before: a JSONDecodeError, TypeError or AttributeError traceback; NaN, negative or string
    timings written into bench.json as a speed; a stream or an error body without end read forever."""
    with serve(answer) as url:
        code, text = _bench(url, tmp_path)
    assert code == 1 and message in text, text
    assert "is this a llama-server?" in text or "HTTP 500" in text


def test_metrics_that_count_nothing_are_not_a_traceback(tmp_path: Path) -> None:
    """Before: a NaN counter in /metrics was a ValueError traceback (int() of NaN) at the first reading."""
    text = (b"llamacpp:spec_decode_num_draft_tokens_total NaN\nllamacpp:spec_decode_num_accepted_tokens_total +Inf\n"
            b"llamacpp:spec_decode_num_drafts_total -3\n")
    with serve(good(), metrics=status(200, text)) as url:
        code, text_ = _bench(url, tmp_path)
    assert code == 0, text_
    sample = json.loads((tmp_path / "bench.json").read_text())["samples"][0]
    assert sample["steps"] is None and sample["drafted"] == 0  # no verify steps known: none made up


def test_a_redirect_to_another_host_is_not_followed(tmp_path: Path) -> None:
    """Before: requests followed it, and the bench measured the other host as the one at --url."""
    with serve(good(), host="127.0.0.2") as other:
        with serve(status(307, Location=f"{other}/completion")) as url:
            code, text = _bench(url, tmp_path)
    assert code == 1 and f"{url}/completion answered HTTP 307, a redirect to {other}/completion" in text, text
    assert "follows no redirect" in text


def test_a_proxy_of_the_environment_is_not_in_between(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the requests went through HTTP_PROXY while the /health before them went to --url."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serve(status(502, b"the proxy"), host="127.0.0.2") as proxy, serve(good()) as url:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("http_proxy", proxy)
        code, text = _bench(url, tmp_path)
    assert code == 0, text


def test_a_server_that_trickles_its_stream_is_given_up_on(tmp_path: Path) -> None:
    """requests' timeout is per read: a byte every 0.1 s kept a request going for ever."""
    prompt = bench.Prompt("math", "m", "2+2?")
    with serve(forever(b"data: ", b"x", pause=0.1)) as url:
        start = time.monotonic()
        with pytest.raises(BuunError, match=r"/completion took more than 1.5 s for one request of 4 tokens"):
            bench.send(url, prompt, "raw", 4, seed=1, timeout=1.5)
        assert time.monotonic() - start < 3
    assert bench.request_timeout(256) == 856.0  # 10 minutes and a second a token


@pytest.mark.parametrize("where", ["bench", "probe"])
def test_a_server_that_trickles_its_headers_is_cut_off(where: str) -> None:
    """Headers a byte at a time: the request was given up on at its deadline, but its thread went
    on reading them, its connection open, for as long as the server kept sending. Now the
    connection is closed and the thread ends with the deadline (bench's requests and the probes
    of /health, /slots and /metrics alike)."""
    gone = threading.Event()
    before = {t for t in threading.enumerate() if t.name == "buun-http"}
    answer = trickled_head(gone)
    with serve(answer, health=answer) as url:  # its POST and its /health
        start = time.monotonic()
        if where == "bench":
            with pytest.raises(BuunError, match=r"took more than 1.5 s"):
                bench.send(url, bench.Prompt("math", "m", "2+2?"), "raw", 4, seed=1, timeout=1.5)
        else:
            probe = Probe(url)
            try:
                assert probe.health(timeout=1.5).detail == "timed out after 1.5 s"
            finally:
                probe.close()
        left = [t for t in threading.enumerate() if t.name == "buun-http" and t not in before]
        assert not left and time.monotonic() - start < 2.5
        assert gone.wait(1), "the connection is still open"


def test_the_credentials_of_the_url_stay_out_of_bench_json(tmp_path: Path) -> None:
    """A server behind a proxy that asks for a password (--url http://user:pass@host) is measured,
    and bench.json records where without the password: it was written there as given."""
    with serve(good()) as url:
        code, text = _bench(url.replace("http://", "http://me:sekrit@"), tmp_path)
    assert code == 0, text
    data = (tmp_path / "bench.json").read_text()
    assert "sekrit" not in data and json.loads(data)["options"]["url"] == url.replace("http://", "http://me:****@")
