"""`buun bench --compare A.json B.json` on recorded runs (no GPU): the same configurations side by
side, a difference flagged when it is larger than the noise the runs themselves show (compare.py
defines it), and a clear error for runs of other configurations or files that are not bench results."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from buun_tool.base.console import printable
from tests.support.recorded_bench import (
    HOSTILE,
    NO_MATPLOTLIB,
    OTHER_CONFIGS,
    RECORDED,
    TWIN,
    bench_cli,
    crafted_run,
    said,
    write_json,
)


class TestCompare:
    def test_a_difference_beyond_the_noise_is_flagged(self, tmp_path: Path) -> None:
        a = json.loads(RECORDED.read_text())
        b = copy.deepcopy(a)
        for s in b["samples"]:  # B is 20% faster at AL 8.31, and 0.5% faster at AL 7.67
            if s["config"] in ("dflash-al8.31", "dflash-al7.67"):
                s["decode_ms"] /= 1.2 if s["config"] == "dflash-al8.31" else 1.005
        for r in b["summary"]:
            if r["config"] in ("dflash-al8.31", "dflash-al7.67"):
                r["decode_tps"] *= 1.2 if r["config"] == "dflash-al8.31" else 1.005
        res = bench_cli("--compare", str(write_json(tmp_path / "a" / "bench.json", a)),
                     str(write_json(tmp_path / "b" / "bench.json", b)), "--out", str(tmp_path / "cmp"), "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert (out["a"], out["b"]) == ("A: a", "B: b")
        rows = {r["config"]: r for r in out["rows"]}
        assert rows["dflash-al8.31"]["ratio"] == pytest.approx(1.2) and rows["dflash-al8.31"]["flagged"] is True
        assert rows["ar"]["ratio"] == pytest.approx(1.0) and rows["ar"]["flagged"] is False
        # two prompts, one request each: the noise is the spread between the prompts
        ar = [s["decode_tokens"] * 1000 / s["decode_ms"] for s in a["samples"] if s["config"] == "ar"]
        assert rows["ar"]["a_noise"] == {"spread": pytest.approx((max(ar) - min(ar)) / (sum(ar) / 2)),
                                         "basis": "prompts"}
        small = rows["dflash-al7.67"]
        assert small["ratio"] == pytest.approx(1.005) and small["flagged"] is (0.005 > small["threshold"])
        png = (tmp_path / "cmp" / "compare.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"

    def test_repeats_are_the_noise_when_the_run_has_them(self, tmp_path: Path) -> None:
        a = json.loads(RECORDED.read_text())
        ar = [s for s in a["samples"] if s["config"] == "ar"]
        again = [dict(s, repeat=1, decode_ms=s["decode_ms"] * 1.1) for s in ar]  # each prompt 10% slower again
        a["samples"] += again
        res = bench_cli("--compare", str(write_json(tmp_path / "a" / "bench.json", a)), str(RECORDED),
                     "--out", str(tmp_path / "cmp"), "--json")
        assert res.exit_code == 0, res.output
        row = next(r for r in json.loads(res.stdout)["rows"] if r["config"] == "ar")
        assert row["a_noise"]["basis"] == "repeats"
        assert row["a_noise"]["spread"] == pytest.approx((1 - 1 / 1.1) / ((1 + 1 / 1.1) / 2))

    def test_one_request_per_row_is_never_flagged(self, tmp_path: Path) -> None:
        a = json.loads(RECORDED.read_text())
        a["samples"] = [s for s in a["samples"] if s["prompt_id"] == a["samples"][0]["prompt_id"]]
        b = copy.deepcopy(a)
        for r in b["summary"]:
            r["decode_tps"] *= 2
        res = bench_cli("--compare", str(write_json(tmp_path / "a" / "bench.json", a)),
                     str(write_json(tmp_path / "b" / "bench.json", b)), "--out", str(tmp_path / "cmp"))
        assert res.exit_code == 0, res.output
        assert "no noise measure" in res.output and "beyond noise" not in res.output

    def test_requests_that_decoded_nothing_have_no_noise(self, tmp_path: Path) -> None:
        """Before: a row whose requests all decoded 0 tokens divided by their mean speed, 0: a
        ZeroDivisionError traceback."""
        a = json.loads(RECORDED.read_text())
        for s in a["samples"]:
            if s["config"] == "ar":
                s["decode_tokens"] = 0
        res = bench_cli("--compare", str(write_json(tmp_path / "a" / "bench.json", a)), str(RECORDED),
                        "--out", str(tmp_path / "cmp"), "--json")
        assert res.exit_code == 0, res.output
        row = next(r for r in json.loads(res.stdout)["rows"] if r["config"] == "ar")
        assert row["a_noise"]["spread"] is None and row["b_noise"]["spread"] is not None

    def test_two_runs_of_the_same_configurations(self, tmp_path: Path) -> None:
        res = bench_cli("--compare", str(RECORDED), str(TWIN), "--out", str(tmp_path), "--json")
        assert res.exit_code == 0, res.output
        rows = json.loads(res.stdout)["rows"]
        assert [r["config"] for r in rows] == ["ar", "dflash-al1", "dflash-al7.67", "dflash-al8.31"]


class TestBadInput:
    def test_names_from_the_files_are_printed_as_they_are(self, tmp_path: Path) -> None:
        """Before: the table read a label, suite or mode as rich markup: `[/]` in one was a MarkupError
        traceback, and a terminal escape in it went to the terminal."""
        a = write_json(tmp_path / "a" / "bench.json", crafted_run())
        res = bench_cli("--compare", str(a), str(a), "--out", str(tmp_path / "cmp"))
        assert res.exit_code == 0, res.output
        assert printable(HOSTILE + "AR") in res.output and printable(HOSTILE + "m") in res.output
        assert "\x1b" not in res.output

    def test_runs_of_different_configurations_are_not_compared(self, tmp_path: Path) -> None:
        res = bench_cli("--compare", str(RECORDED), str(OTHER_CONFIGS), "--out", str(tmp_path))
        text = said(res.output)
        assert res.exit_code == 2, res.output
        assert "did not measure the same configurations" in text and f"only in {RECORDED}: ar (code raw)" in text
        assert "same --synthetic-al" in text
        assert not list(tmp_path.iterdir())

    @pytest.mark.parametrize("content, message", [
        ("not json {", "is not a readable JSON file"),
        ('{"format": 99}', "is a bench result of format 99; this buun reads formats 1 to 2"),
    ])
    def test_a_file_that_is_not_a_bench_result(self, tmp_path: Path, content: str, message: str) -> None:
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        res = bench_cli("--compare", str(RECORDED), str(bad), "--out", str(tmp_path / "out"))
        assert res.exit_code == 2 and message in said(res.output), res.output
        assert "Traceback" not in res.output and not (tmp_path / "out").exists()

    def test_without_matplotlib_the_table_is_printed_and_no_folder_made(self, tmp_path: Path) -> None:
        out = subprocess.run([*NO_MATPLOTLIB, "bench", "--compare", str(RECORDED), str(TWIN), "--out",
                              str(tmp_path / "cmp")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "B/A" in out.stdout and "pip install -e '.[bench]'" in said(out.stderr)
        assert not (tmp_path / "cmp").exists()
