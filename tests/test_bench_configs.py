"""`buun bench`'s configurations: the recipe's server flags plus named overrides, built into the
same argv `buun serve` runs."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from buun_tool.base import command
from buun_tool.cli.app import app
from buun_tool.formats import recipes
from buun_tool.measure import bench_configs
from buun_tool.measure.bench_configs import AR, UPSTREAM, Models, Overrides

MODELS = Models(Path("/m/t.gguf"), Path("/m/d.gguf"))
MODELS_DIR = Path("/m")  # the folder a `-c fit` would weigh; bench pins -c


def _argv(cfg: bench_configs.ServerConfig, overrides: Overrides, fake_bin: Path, port: int = 9000) -> list[str]:
    return bench_configs.argv(recipes.load(), cfg, MODELS, fake_bin / "llama-server", port, overrides, MODELS_DIR)


def _serve(*args: str) -> list[str]:
    """`buun serve --print-cmd` of the default recipe with the same models, split."""
    r = CliRunner().invoke(app, ["serve", "--model", str(MODELS.target), "--draft", str(MODELS.drafter),
                                 "--print-cmd", *args])
    assert r.exit_code == 0, r.output
    return r.stdout.split()


class TestConfigs:
    def test_ar_then_one_server_per_length(self) -> None:
        cfgs = bench_configs.configs(ar=True, synthetic_al=[1.0, 7.67])
        assert [c.name for c in cfgs] == ["ar", "dflash-al1", "dflash-al7.67"]
        assert cfgs[2].overrides == Overrides(set=(("--spec-synth-len", "7.67"),)) and cfgs[2].synthetic_al == 7.67
        assert [c.label for c in bench_configs.configs(ar=False, synthetic_al=None)] == ["DFlash"]

    def test_al_sweep_adds_one_to_ten_after_the_lengths_given(self) -> None:
        assert bench_configs.synthetic_lengths([7.67, 2.0], sweep=True) == [7.67, 2.0, 1.0, *map(float, range(3, 11))]
        assert bench_configs.synthetic_lengths([7.67], sweep=False) == [7.67]
        assert bench_configs.synthetic_lengths(None, sweep=False) == []
        # a draft of 3 tokens reaches AL 4 at most: the sweep stops there (a length given is checked)
        assert bench_configs.synthetic_lengths([2.0], sweep=True, n_max=3) == [2.0, 1.0, 3.0, 4.0]

    def test_a_configuration_is_data_in_the_json(self) -> None:
        data = bench_configs.synthetic(3.0).to_json()
        assert data == {"name": "dflash-al3", "label": "DFlash AL 3 (synthetic)", "spec": True, "synthetic_al": 3.0,
                        "tree_budget": None, "expected_al": None, "concurrency": 1,
                        "overrides": {"set": [["--spec-synth-len", "3"]], "drop": [], "respell": []}, "build": "buun"}


class TestOverrides:
    def test_later_wins_on_the_same_option(self) -> None:
        a = Overrides(set=(("-c", "1024"), ("--draft-max", "8")), drop=("--jinja",))
        b = Overrides(set=(("--ctx-size", "2048"), ("--jinja", None)), drop=("--draft-max",))
        both = a.then(b)
        assert both.set == (("--ctx-size", "2048"), ("--jinja", None)) and both.drop == ("--draft-max",)

    def test_upstream_respells_in_place(self) -> None:
        base = command.recipe_flags(recipes.load().server_flags)
        sets, drops = UPSTREAM.serve_args(base)
        # upstream has no tree (patch 0023), no verify maximum over slots (0031), no rests (0033)
        assert drops == ["-cd", "--spec-tree-budget", "--spec-tree-k", "--spec-verify-max", "--spec-skip-after"]
        assert sets == [("--spec-type", "draft-dflash"), ("--spec-draft-n-max", "16"), ("--spec-draft-n-min", "1")]
        # a value given on the bench command line is respelled with its own value
        sets, _ = Overrides(set=(("--draft-max", "8"),)).then(UPSTREAM).serve_args(base)
        assert ("--spec-draft-n-max", "8") in sets and all(n != "--draft-max" for n, _ in sets)


class TestArgv:
    """The issue's check: a configuration's argv is `buun serve`'s for the same recipe plus its overrides."""

    def test_a_synthetic_configuration_is_serve_plus_its_overrides(self, fake_bin: Path) -> None:
        common = bench_configs.common(ctx=1024, server_args=["-nr"])
        got = _argv(bench_configs.synthetic(7.67), common, fake_bin)
        assert got == _serve("--port", "9000", "--", "-c", "1024", "-nr", "--spec-synth-len", "7.67")
        assert got[got.index("--draft-max") + 1] == "16" and got[got.index("-cd") + 1] == "256"  # the recipe's

    def test_the_bench_command_line_changes_every_configuration_as_serve_would(self, fake_bin: Path) -> None:
        common = bench_configs.common(ctx=2048, draft_max=12, host_sampling=True)
        got = _argv(bench_configs.DFLASH, common, fake_bin)
        assert got == _serve("--port", "9000", "--drop", "--backend-sampling", "--", "-c", "2048", "--draft-max", "12")

    def test_upstream_is_serve_with_upstream_spellings(self, fake_bin: Path) -> None:
        got = _argv(bench_configs.synthetic(2.0), bench_configs.common(ctx=1024).then(UPSTREAM), fake_bin)
        assert got == _serve("--port", "9000", "--drop", "-cd", "--drop", "--spec-verify-max", "--drop",
                             "--spec-skip-after", "--", "-c", "1024",
                             "--spec-synth-len", "2", "--spec-type", "draft-dflash", "--spec-draft-n-max", "16",
                             "--spec-draft-n-min", "1")

    def test_a_twin_on_upstream_is_its_configuration_then_the_upstream_set(self, fake_bin: Path) -> None:
        cfgs = bench_configs.against_upstream(bench_configs.configs(ar=True, synthetic_al=[2.0]))
        assert [(c.name, c.build) for c in cfgs] == [("ar", "buun"), ("ar-upstream", "upstream"),
                                                     ("dflash-al2", "buun"), ("dflash-al2-upstream", "upstream")]
        twin = cfgs[3]
        assert twin.label == "DFlash AL 2 (synthetic), upstream" and twin.synthetic_al == 2.0 and twin.spec
        common = bench_configs.common(ctx=1024)
        assert _argv(twin, common, fake_bin) == _argv(bench_configs.synthetic(2.0), common.then(UPSTREAM), fake_bin)
        assert "-md" not in _argv(cfgs[1], common, fake_bin)

    def test_a_tree_sweeps_configuration_has_no_upstream_twin(self) -> None:
        """Upstream has no tree verification (patch 0023): the sweep runs on buun's build only."""
        trees = bench_configs.tree_configs([0, 8], recipes.load(), bench_configs.common(), MODELS_DIR)
        cfgs = bench_configs.configs(ar=True, synthetic_al=None, trees=trees)
        assert bench_configs.without_twin(cfgs) == trees
        assert [c.name for c in bench_configs.against_upstream(cfgs)] == ["ar", "ar-upstream", "dflash-tree0",
                                                                          "dflash-tree8"]

    def test_ar_has_no_drafter_and_no_draft_flag(self, fake_bin: Path) -> None:
        got = _argv(AR, bench_configs.common(ctx=1024, draft_max=8), fake_bin)
        keys = {command.canonical(t) for t in got if t.startswith("-")}
        assert "-md" not in keys and not keys & set(bench_configs.DRAFT_OPTIONS)
        assert {"-c", "-ngl", "-np", "-fa", "-b", "-ub", "--jinja", "-bs", "--metrics"} <= keys  # the rest as served


def test_a_secret_in_server_args_is_refused_before_bench_json_records_it(tmp_path: Path) -> None:
    """--server-args are written into bench.json (options.overrides), so a key or token among them
    was stored in the clear, for a server that never got it (secrets are taken out of its argv)."""
    for args in ("--api-key sekrit", "--api-key=sekrit", "--hf-token sekrit", "-nr -hft sekrit"):
        r = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--prompts", "1",
                                     "--server-args", args, "--out", str(tmp_path)])
        assert r.exit_code == 2, r.output
        assert "takes a secret" in " ".join(r.stderr.split()) and "sekrit" not in r.output
        assert not (tmp_path / "bench.json").exists()
