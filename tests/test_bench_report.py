"""`buun bench --report-from` on recorded runs (no GPU, no llama.cpp build): the report holds every
chart and table and loads in headless Chromium with no console error and no request; bad input is
a message, not a traceback. Chromium: Debian's `chromium` (`make dev`); missing, the browser test
fails, never skips."""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from buun_tool.measure import bench, figures, report, treeprofile
from tests.support.chromium import Chromium, find_chromium
from tests.support.recorded_bench import (
    HOSTILE,
    NO_MATPLOTLIB,
    RECORDED,
    bench_cli,
    crafted_run,
    said,
    tree_sweep_run,
    write_json,
)

CHARTS = ("speed", "acceptance", "al-sweep", "memory")
TABLES = ("speed", "acceptance", "al-sweep", "memory", "machine", "build", "prompts")
SWEEP = "tree-sweep"  # tree_sweep_run(): RECORDED's machine with a tree budget sweep, and every chart


def _source(tmp_path: Path, name: str) -> tuple[Path, tuple[str, ...], tuple[str, ...]]:
    """A run to render and the charts and tables its report must hold."""
    if name != SWEEP:
        return RECORDED, CHARTS, TABLES
    return write_json(tmp_path / "run" / "bench.json", tree_sweep_run()), (*CHARTS, "tree"), (*TABLES, "tree")


class _Page(HTMLParser):
    """Element ids, their classes, and every URL-valued attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, dict[str, str | None]] = {}
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids[str(a["id"])] = {"tag": tag, **a}
        self.urls += [str(v) for k, v in attrs if k in ("src", "href", "srcset", "poster", "data", "action") and v]


def _parse(path: Path) -> tuple[_Page, str]:
    text = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    return page, text


def _report(tmp_path: Path, source: Path = RECORDED, *extra: str) -> Path:
    res = bench_cli("--report-from", str(source), "--out", str(tmp_path), *extra)
    assert res.exit_code == 0, res.output
    return tmp_path / "report.html"


class TestReport:
    def test_every_chart_and_table_is_there_and_nothing_is_linked(self, tmp_path: Path) -> None:
        page, text = _parse(_report(tmp_path))
        for ident, _ in report.SECTIONS:
            assert page.ids[ident]["tag"] == "section", ident
        for ident in CHARTS:
            src = str(page.ids[f"chart-{ident}"]["src"])
            assert src.startswith("data:image/png;base64,"), ident
            assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n", ident
        for ident in TABLES:
            assert page.ids[f"table-{ident}"]["tag"] == "table", ident
        # self-contained: no URL but data: and the page's own anchors, no script, no stylesheet link
        assert page.urls and all(u.startswith(("data:", "#")) for u in page.urls), \
            [u for u in page.urls if not u.startswith(("data:", "#"))]
        assert "<script" not in text and "<link" not in text and "@import" not in text

    def test_what_the_run_holds_is_shown(self, tmp_path: Path) -> None:
        data = json.loads(RECORDED.read_text())
        _, text = _parse(_report(tmp_path))
        text = unescape(text)
        for argv in data["commands"].values():  # the exact server commands
            assert shlex.join(argv) in text
        assert data["machine"]["gpus"][0]["name"] in text and data["llama_cpp"]["pin"] in text
        for row in data["summary"]:
            assert f"{row['decode_tps']:.1f}" in text and row["label"] in text
        # the prompts: the run names code/fib and code/quicksort from buun's own file
        used = {s["prompt_id"] for s in data["samples"]}
        lines = (Path(__file__).resolve().parent.parent / "buun_tool/data/prompts/code.jsonl").open()
        shown = [p["id"] for p in map(json.loads, lines) if p["id"] in used and p["prompt"] in text]
        assert sorted(shown) == sorted(used) == ["code/fib", "code/quicksort"]

    def test_what_the_run_lacks_is_said_not_drawn(self, tmp_path: Path) -> None:
        page, text = _parse(_report(tmp_path))
        for ident in ("tree", "concurrency"):
            assert re.search(rf'<section id="{ident}"><h2>[^<]*</h2><p class="not-run">Not run', text), ident
        # a format-1 run records neither the bandwidth nor the weights: no bound, and why
        assert "bandwidth bound not drawn" in unescape(text) and "bound tok/s" in text
        # given the bandwidth, the weights a step reads are still missing, and said so
        _, text = _parse(_report(tmp_path / "bw", RECORDED, "--bandwidth-gbs", "3350"))
        note = unescape(re.search(r'<p class="note" id="bound-note">([^<]*)</p>', text).group(1))
        assert note.startswith("bandwidth bound not drawn") and "the weights a step reads" in note
        assert "memory bandwidth" not in note

    def test_a_run_with_its_limits_draws_the_bound(self, tmp_path: Path) -> None:
        data = json.loads(RECORDED.read_text())
        data["format"] = 2
        data["limits"] = {"bandwidth_gbs": 3350.0, "bandwidth_source": "datasheet (NVIDIA H100 80GB HBM3)",
                          "target_bytes": 15_500_000_000, "drafter_bytes": 900_000_000, "weights_source": "GGUF files"}
        src = tmp_path / "run" / "bench.json"
        src.parent.mkdir()
        src.write_text(json.dumps(data))
        _, text = _parse(_report(tmp_path, src))
        note = unescape(re.search(r'<p class="note" id="bound-note">([^<]*)</p>', text).group(1))
        assert note.startswith("bandwidth bound: AL x 3350 GB/s") and "16.40 GB read per step" in note
        # the AL 7.67 row: measured AL 7.74 at 3350 GB/s over 16.4 GB is 1581 tok/s at most
        row = next(r for r in data["summary"] if r["config"] == "dflash-al7.67")
        bound = row["mean_al"] * 3350e9 / 16.4e9
        assert f"<td>{bound:.0f}</td><td>{row['decode_tps'] / bound:.0%}</td>" in text

    def test_without_matplotlib_the_report_says_how_to_get_it(self, tmp_path: Path) -> None:
        out = subprocess.run([*NO_MATPLOTLIB, "bench", "--report-from", str(RECORDED), "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 3 and "pip install -e '.[bench]'" in said(out.stderr), out.stdout + out.stderr
        assert "Traceback" not in out.stderr and not (tmp_path / "report.html").exists()


BUDGETS = (0, 8, 16, 22, 32)  # tree_sweep_run()'s


def _feigned(budget: int) -> tuple[int, float, float]:
    """What tree_sweep_run() feigns for a budget, worked out here: 512 tokens in round(512 / (0.98 x
    expected AL)) steps of 18 ms, 0.6% more per node past 16; the steps, a step's ms and the tok/s."""
    steps = round(512 / (0.98 * treeprofile.DEFAULT.served_al(budget)))
    ms = 18.0 * (1 + 0.006 * max(budget - 16, 0))
    return steps, ms, 512e3 / (steps * ms)


class TestTreeSweep:
    """A run with `--tree-budget 8,16,22,32`: the sweep's chart and table, with the AL the profile
    expects beside the measured one, the step time and the tok/s against the chain's."""

    def test_the_sweep_is_drawn_and_tabled(self, tmp_path: Path) -> None:
        source, charts, tables = _source(tmp_path, SWEEP)
        page, text = _parse(_report(tmp_path, source))
        for ident in charts:
            assert str(page.ids[f"chart-{ident}"]["src"]).startswith("data:image/png;base64,"), ident
        for ident in tables:
            assert page.ids[f"table-{ident}"]["tag"] == "table", ident
        assert '<section id="tree"><h2>Tree budget sweep</h2><p class="note">' in text
        body = re.search(r'<table id="table-tree">.*?<tbody>(.*?)</tbody>', text).group(1)
        rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", body)]
        assert [r[3] for r in rows] == ["0", "8", "16", "22", "32"]
        chain_tps = _feigned(0)[2]
        for row, budget in zip(rows, BUDGETS, strict=True):
            expected = treeprofile.DEFAULT.served_al(budget)
            steps, ms, tps = _feigned(budget)
            assert row[1:] == ["code", "raw", str(budget), f"{expected:.2f}", f"{1 + (512 - steps) / steps:.2f}",
                               f"{ms:.2f}", f"{tps:.1f}", f"{tps / chain_tps:.2f}x"]
        assert rows[0][0] == "DFlash chain (synthetic tree)" and rows[3][0] == "DFlash tree 22 (synthetic tree)"
        assert rows[3][4] == "8.31" and rows[0][4] == "7.67"  # the calibration's two figures
        assert "served with the calibrated synthetic tree profile" in said(text)

    def test_the_fastest_budget_is_named(self) -> None:
        data = tree_sweep_run()
        ratios = {b: _feigned(b)[2] / _feigned(0)[2] for b in BUDGETS}
        best = max(ratios, key=ratios.__getitem__)
        assert best == 32 and figures.best_tree_budget(data) == (32, pytest.approx(ratios[32]))
        assert bench.tree_verdict(data) == (f"tree sweep: budget 32 is the fastest under the synthetic tree profile, "
                                            f"{ratios[32]:.2f}x the chain's tok/s: serve it with `buun serve "
                                            "--tree-budget 32` or the recipe's server.tree.budget")
        for row in data["summary"]:  # every tree 10% slower: the chain is the fastest
            if row["config"] not in ("dflash-tree0", "ar", "dflash-al1", "dflash-al7.67"):
                row["decode_tps"] *= 0.9
        assert figures.best_tree_budget(data) == (0, 1.0)
        assert bench.tree_verdict(data) == ("tree sweep: the chain is the fastest under the synthetic tree profile: "
                                            "keep the recipe's server.tree.budget 0")
        assert bench.tree_verdict(json.loads(RECORDED.read_text())) is None  # no sweep

    def test_a_sweep_of_real_models_says_so(self, tmp_path: Path) -> None:
        """`--tree-budget` with --target/--drafter: every budget on the drafter's own acceptance."""
        data = tree_sweep_run()
        for cfg in data["configs"]:
            if cfg["tree_budget"] is not None:
                i = cfg["argv"].index("--spec-synth-tree")
                del cfg["argv"][i:i + 2]
        assert not figures.tree_profiled(data) and figures.tree_profiled(tree_sweep_run())
        assert bench.tree_verdict(data).startswith("tree sweep: budget 32 is the fastest on these models, ")
        _, text = _parse(_report(tmp_path, write_json(tmp_path / "real" / "bench.json", data)))
        assert "served with the drafter's own acceptance on these models and prompts" in said(text)
        assert "synthetic tree profile" not in text

    def test_a_sweep_without_argv(self, tmp_path: Path) -> None:
        """argv is null where bench started no server; before, a sweep's null argv was a TypeError traceback."""
        data = tree_sweep_run()
        for cfg in data["configs"]:
            cfg["argv"] = None
        assert not figures.tree_profiled(data)
        _, text = _parse(_report(tmp_path, write_json(tmp_path / "run" / "bench.json", data)))
        assert '<table id="table-tree">' in text

    def test_the_al_sweep_leaves_the_tree_sweep_out(self, tmp_path: Path) -> None:
        """Both sweeps in one run: each chart and table holds its own configurations only."""
        _, text = _parse(_report(tmp_path, _source(tmp_path, SWEEP)[0]))
        al_table = re.search(r'<table id="table-al-sweep">(.*?)</table>', text).group(1)
        assert "DFlash AL 7.67" in al_table and "synthetic tree" not in al_table
        tree_table = re.search(r'<table id="table-tree">(.*?)</table>', text).group(1)
        assert "DFlash AL" not in tree_table and ">AR<" not in tree_table


class TestReportInBrowser:
    def _open(self, tmp_path: Path, page: Path) -> tuple[Chromium, dict[str, Any]]:
        binary = find_chromium()
        if binary is None:
            pytest.fail("Chromium is not installed: apt-get install -y chromium (make dev)")
        browser = Chromium(binary, tmp_path / "profile", tmp_path / "chromium.log")
        try:
            browser.open_page(page.as_uri(), watch=True)
            browser.wait_for("document.readyState === 'complete'", 60, "the page to load")
            state = browser.js("({images: [...document.images].map(i => [i.id, i.complete && i.naturalWidth > 0]),"
                               " tables: [...document.querySelectorAll('table')].map(t => [t.id, t.rows.length])})")
        except Exception:
            browser.close()
            raise
        return browser, state

    @pytest.mark.parametrize("run", ["recorded", SWEEP])
    def test_the_report_loads_with_no_console_error_and_no_request(self, tmp_path: Path, run: str) -> None:
        source, charts, tables = _source(tmp_path, run)
        page = _report(tmp_path, source)
        browser, state = self._open(tmp_path, page)
        try:
            errors, requests = browser.console_errors(), browser.requests()
        finally:
            browser.close()
            shutil.rmtree(tmp_path / "profile", ignore_errors=True)
        assert dict(state["images"]) == {f"chart-{c}": True for c in charts}  # every chart decoded
        rows = dict(state["tables"])
        assert all(rows[f"table-{t}"] > 1 for t in tables), rows
        assert errors == []
        # the page itself, then its own data: images; nothing that leaves the file
        assert [u for u in requests if not u.startswith("data:") and u != page.as_uri()] == []

    def test_the_check_sees_a_request_and_a_console_error(self, tmp_path: Path) -> None:
        """The two watches above can fail: a page that loads a URL and logs an error is caught."""
        page = tmp_path / "bad.html"
        page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
                        '<script>console.error("boom")</script></body></html>')
        browser, _ = self._open(tmp_path, page)
        try:
            browser.js("1")  # one more round trip: the events sent before it are read
            errors, requests = browser.console_errors(), browser.requests()
        finally:
            browser.close()
        assert "http://127.0.0.1:9/x.png" in requests and "boom" in errors


class _Markup(HTMLParser):
    """Every tag and attribute name of a page, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs |= {k for k, _ in attrs}

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _markup(path: Path) -> _Markup:
    page = _Markup()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


class TestCraftedRun:
    def test_its_strings_are_text_not_markup(self, tmp_path: Path) -> None:
        """Before: matplotlib read the `$` pair of a label as mathtext and drawing the chart raised
        ValueError (a traceback); every string must also reach the page as text."""
        ours = _markup(_report(tmp_path / "ours"))
        page = _markup(_report(tmp_path / "crafted", write_json(tmp_path / "run" / "bench.json", crafted_run())))
        assert "script" not in page.tags and not [a for a in page.attrs if a.startswith("on")]
        assert page.tags <= ours.tags and page.attrs <= ours.attrs  # only the markup buun writes itself
        shown = [t for t in page.text if HOSTILE in t]
        assert len(shown) > 10, shown  # names, machine, pin, commands, prompts: shown, whole, as text


class TestBadInput:
    @pytest.mark.parametrize("content, message", [
        ("not json {", "is not a readable JSON file"),
        ("[1, 2]", "holds a JSON list, not a `buun bench` result"),
        ('{"created": "x", "machine": {}}', "is not a `buun bench` result: it has no llama_cpp, options"),
        ('{"format": 99}', "is a bench result of format 99; this buun reads formats 1 to 2"),
        (json.dumps({"created": "x", "machine": {}, "llama_cpp": {}, "options": {}, "commands": {}, "configs": [],
                     "summary": [], "samples": []}), "holds no measurement"),
        (json.dumps({"created": "x", "machine": [], "llama_cpp": {}, "options": {}, "commands": {}, "configs": [],
                     "summary": [], "samples": []}), "machine is a JSON list, expected an object"),
    ])
    def test_a_file_that_is_not_a_bench_result(self, tmp_path: Path, content: str, message: str) -> None:
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        res = bench_cli("--report-from", str(bad), "--out", str(tmp_path / "out"))
        assert res.exit_code == 2 and message in said(res.output), res.output
        assert "Traceback" not in res.output and not (tmp_path / "out").exists()

    @pytest.mark.parametrize("change, message", [
        (lambda d: d["summary"][0].update(decode_tps=float("nan")), "summary[0].decode_tps is NaN, expected a number"),
        (lambda d: d["summary"][1].update(speedup=float("inf")), "summary[1].speedup is Infinity, expected a number"),
        (lambda d: d["summary"][0].update(decode_tps="fast"), 'summary[0].decode_tps is "fast", expected a number'),
        (lambda d: d["summary"][0].update(requests=2.5), "summary[0].requests is 2.5, expected a whole number"),
        (lambda d: d["summary"][0].update(label=5), "summary[0].label is 5, expected a string"),
        (lambda d: d["summary"][2].update(accept_per_pos=["a"]),
         'summary[2].accept_per_pos is ["a"], expected a list'),
        (lambda d: d["samples"][0].update(decode_ms=-5), "samples[0].decode_ms is -5, expected a number from 0"),
        (lambda d: d["configs"][0].update(peak_gpu_mib=10**30),
         f"configs[0].peak_gpu_mib is {10**30}, expected a whole number from 0 to 1e15"),
        (lambda d: d["configs"][0].update(spec="no"), 'configs[0].spec is "no", expected true or false'),
        (lambda d: d["machine"].update(gpus={"a": 1}), "machine.gpus is a JSON dict, expected a list"),
        (lambda d: d["machine"].update(gpus=[{}]), "machine.gpus[0] has no name"),
        (lambda d: d["commands"].update(ar="llama-server -m x"), 'commands.ar is "llama-server -m x", expected a list'),
        (lambda d: d.update(prompt_sources=["code"]), "prompt_sources is a JSON list, expected an object"),
        (lambda d: d.update(prompts=[{"suite": "code"}]), "prompts[0] has no id, text"),
        (lambda d: d.update(format=2, limits={"bandwidth_gbs": 100, "target_bytes": 0}),
         "limits.target_bytes is 0, expected a number above 0"),
    ], ids=["nan", "infinity", "string", "fraction", "label", "positions", "negative", "huge", "bool", "gpus",
            "gpu", "argv", "sources", "prompt", "zero bytes"])
    def test_a_field_of_the_wrong_kind_is_named(self, tmp_path: Path, change: Any, message: str) -> None:
        """Before: each was a traceback in a chart or a table (ValueError, TypeError, KeyError,
        OverflowError, ZeroDivisionError), or, for a negative time, a negative speed drawn."""
        data = json.loads(RECORDED.read_text())
        change(data)
        src = write_json(tmp_path / "r" / "bench.json", data)
        for args in (("--report-from", str(src)), ("--compare", str(src), str(src))):
            res = bench_cli(*args, "--out", str(tmp_path / "out"))
            assert res.exit_code == 2 and f"{src}: {message}" in said(res.output), res.output
        assert not (tmp_path / "out").exists()

    @pytest.mark.parametrize("content, message", [
        ("[" * 100_000, "is not a readable JSON file (maximum recursion depth exceeded"),
        ('{"format": ' + "9" * 5000 + "}", "is not a readable JSON file (Exceeds the limit (4300 digits)"),
        (b'{"created": "\xe9"}', "is not a readable JSON file ('utf-8' codec can't decode byte 0xe9"),
        (b" " * (64 * 2**20 + 1), "is larger than 64 MiB: not a `buun bench` result"),
    ], ids=["deep", "long integer", "latin-1", "huge"])
    def test_json_that_python_cannot_hold(self, tmp_path: Path, content: str | bytes, message: str) -> None:
        """Before: deep nesting was a RecursionError traceback; a file of any size was read whole."""
        bad = tmp_path / "bad.json"
        bad.write_bytes(content if isinstance(content, bytes) else content.encode())
        res = bench_cli("--report-from", str(bad), "--out", str(tmp_path / "out"))
        assert res.exit_code == 2 and f"{bad} {message}" in said(res.output), res.output

    def test_a_folder(self, tmp_path: Path) -> None:
        res = bench_cli("--report-from", str(tmp_path))
        assert res.exit_code == 2 and f"{tmp_path} is a folder, not a bench.json" in said(res.output), res.output
        write_json(tmp_path / "bench.json", json.loads(RECORDED.read_text()))
        res = bench_cli("--compare", str(tmp_path), str(RECORDED))
        assert res.exit_code == 2 and f"hint: pass {tmp_path / 'bench.json'}" in said(res.output), res.output

    def test_a_report_html_that_is_a_link_is_replaced_not_written_through(self, tmp_path: Path) -> None:
        """Before: --report-from wrote report.html beside the JSON through the link, over the file it
        pointed at (a folder someone sent, with report.html -> ~/.bashrc)."""
        victim = tmp_path / "victim"
        victim.write_text("mine")
        sent = write_json(tmp_path / "sent" / "bench.json", json.loads(RECORDED.read_text()))
        (sent.parent / "report.html").symlink_to(victim)
        res = bench_cli("--report-from", str(sent))
        assert res.exit_code == 0, res.output
        assert victim.read_text() == "mine"
        page = sent.parent / "report.html"
        assert not page.is_symlink() and page.read_text().startswith("<!DOCTYPE html>")

    def test_a_summary_row_from_another_version(self, tmp_path: Path) -> None:
        data = json.loads(RECORDED.read_text())
        del data["summary"][1]["accept_per_pos"]
        res = bench_cli("--report-from", str(write_json(tmp_path / "r" / "bench.json", data)))
        assert res.exit_code == 2 and "summary[1] has no accept_per_pos" in said(res.output), res.output

    def test_a_bandwidth_that_is_not_one(self, tmp_path: Path) -> None:
        res = bench_cli("--report-from", str(RECORDED), "--out", str(tmp_path), "--bandwidth-gbs", "0")
        assert res.exit_code == 2 and "expected the card's memory bandwidth in GB/s" in said(res.output)
        assert not (tmp_path / "report.html").exists()

    def test_a_missing_file(self, tmp_path: Path) -> None:
        res = bench_cli("--report-from", str(tmp_path / "nope.json"))
        assert res.exit_code == 2 and "does not exist" in said(res.output)
