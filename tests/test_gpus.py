"""Several GPUs in one host: the layer split's arithmetic against llama.cpp's rule and the
one-card planner, what `buun serve --gpus` hands llama-server (environment and flags) and what it
refuses, `buun fit --gpu-mem 24,24`, and doctor, build and status with a fake nvidia-smi listing
a 3090 and a 4090. A split server itself needs CUDA: that part is the GPU run's."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from buun_tool.base import command, nvidia, paths
from buun_tool.base.errors import UsageError
from buun_tool.cli.app import app
from buun_tool.formats import recipes
from buun_tool.measure import bench_configs
from buun_tool.pipeline import build, doctor
from buun_tool.plan import devices, fit, split
from buun_tool.server import settings, spec
from tests.support.fake_gpus import RTX_3090, fake_build, write_nvidia_smi

GIVEN = {"models_dir": Path("/m"), "model": Path("/m/t.gguf"), "draft": Path("/m/d.gguf")}
SPLIT_FLAGS = ("-sm", "-ts", "-dev", "-devd")


@pytest.fixture(scope="module")
def recipe() -> recipes.Recipe:
    return recipes.load()


@pytest.fixture(scope="module")
def weights(recipe: recipes.Recipe) -> fit.Weights:
    return fit.weights_from_plan(recipe, "full", "q4_k_m", "q4_k")


def flat(text: str) -> str:
    return " ".join(text.split())


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# --- llama.cpp's rule ------------------------------------------------------------------------

class TestLayerRule:
    def test_layer_counts_as_ts_give_back_the_same_counts(self) -> None:
        """-ts a,b(,c) summing to n_layer + 1 puts exactly a, b (, c) layers on the cards, for every
        split of 64 (and 8, the tiny model's) layers over two and three cards."""
        for n in (8, 64):
            for a in range(1, n + 1):
                assert split.counts_of(split.layer_devices([a, n + 1 - a], n), 2) == [a, n + 1 - a]
                for b in range(1, n + 1 - a):
                    want = [a, b, n + 1 - a - b]
                    assert split.counts_of(split.layer_devices(want, n), 3) == want

    def test_proportions_follow_the_cumulative_rule(self) -> None:
        """Layer i of 64 (+ the output, i = 64) goes to the first card whose cumulative share
        exceeds i / 65: -ts 1,1 gives 33 and 32, -ts 3,1 gives 49 and 16, the output on the last."""
        assert split.counts_of(split.layer_devices([1, 1], 64), 2) == [33, 32]
        assert split.counts_of(split.layer_devices([3, 1], 64), 2) == [49, 16]
        devs = split.layer_devices([0.5, 0.25, 0.25], 64)
        assert devs[-1] == 2 and devs == sorted(devs)
        with pytest.raises(UsageError, match="-ts 0,0"):
            split.layer_devices([0, 0], 64)


# --- the split plan --------------------------------------------------------------------------

class TestPlan:
    def test_one_card_is_the_one_card_planner(self, recipe: recipes.Recipe, weights: fit.Weights) -> None:
        f = fit.flags_from_recipe(recipe)
        for ctx in (6048, 65536):
            one = split.plan(recipe, replace(f, ctx=ctx), split.cards_from_gib([24]), weights=weights)
            pred = fit.predict(recipe, replace(f, ctx=ctx), weights=weights)
            assert one.cards[0].components == {c.key: c.bytes for c in pred.components}
            assert one.ts == "65" and one.cards[0].layers() == "0-63 + output"
        assert split.max_context(recipe, f, split.cards_from_gib([24]), weights=weights) \
            == fit.max_context(recipe, f, 24.0, weights=weights)

    def test_every_byte_lands_on_one_card(self, recipe: recipes.Recipe, weights: fit.Weights) -> None:
        f = replace(fit.flags_from_recipe(recipe), ctx=32768)
        s = split.plan(recipe, f, split.cards_from_gib([24, 24]), weights=weights)
        t = recipe.geometry_at("full").target

        def total(key: str) -> int:
            return sum(c.components.get(key, 0) for c in s.cards)

        assert total("target_weights") == weights.target_gpu
        assert abs(total("target_kv") - fit.target_kv(t, f)) <= 2
        assert abs(total("recurrent") - fit.recurrent(t, f)) <= 2
        assert total("drafter_weights") == weights.drafter_gpu
        # the drafter, its features and the draft context's overhead on its card only
        assert [c.drafter for c in s.cards] == [False, True]
        assert "features" not in s.cards[0].components

    def test_two_cards_hold_more_than_twice_the_context(self, recipe: recipes.Recipe, weights: fit.Weights) -> None:
        """The issue's target for the default 27B recipe: on 2x24 GB at least twice one card's context
        (here the trained maximum, 262144, against 108544)."""
        f = fit.flags_from_recipe(recipe)
        one = split.max_context(recipe, f, split.cards_from_gib([24]), weights=weights)
        two = split.max_context(recipe, f, split.cards_from_gib([24, 24]), weights=weights)
        assert one > 0 and two >= 2 * one
        assert two <= recipe.geometry_at("full").target.max_position_embeddings

    def test_the_largest_context_fits_and_one_step_more_does_not(self, recipe: recipes.Recipe,
                                                                 weights: fit.Weights) -> None:
        f = fit.flags_from_recipe(recipe)
        cards = split.cards_from_gib([16, 12])  # small enough that the context, not the trained maximum, binds
        best = split.max_context(recipe, f, cards, weights=weights)
        assert 0 < best < recipe.geometry_at("full").target.max_position_embeddings
        at = split.plan(recipe, replace(f, ctx=best), cards, weights=weights)
        assert at.fits and sum(at.counts) == 65
        for ts in ([n, 65 - n] for n in range(1, 65)):  # no split of one more step fits
            more = split.plan(recipe, replace(f, ctx=best + fit.CELL_PAD), cards, weights=weights, proportions=ts)
            assert not more.fits

    def test_the_drafters_card_gets_fewer_layers(self, recipe: recipes.Recipe, weights: fit.Weights) -> None:
        f = fit.flags_from_recipe(recipe)
        cards = split.cards_from_gib([24, 24])
        last = split.plan(recipe, replace(f, ctx=65536), cards, weights=weights)
        first = split.plan(recipe, replace(f, ctx=65536), cards, 0, weights)
        assert last.counts[1] < last.counts[0] and first.counts[0] < first.counts[1]
        assert last.draft.device == "CUDA1" and first.draft.device == "CUDA0"
        for s in (last, first):  # the ts round-trips through llama.cpp's rule; the cards keep alike free memory
            assert split.counts_of(split.layer_devices(s.counts, s.n_layer), 2) == s.counts
            assert abs(s.cards[0].free - s.cards[1].free) < 1.0 * fit.GIB
            assert s.cards[-1].output and not s.cards[0].output

    def test_a_split_that_fits_nowhere_says_so(self, recipe: recipes.Recipe, weights: fit.Weights) -> None:
        f = replace(fit.flags_from_recipe(recipe), ctx=6048)
        s = split.plan(recipe, f, split.cards_from_gib([6, 6]), weights=weights)
        assert not s.fits and sum(s.counts) == 65
        assert split.max_context(recipe, f, split.cards_from_gib([6, 6]), weights=weights) == 0
        with pytest.raises(UsageError, match="each card of a split holds at least one"):
            split.plan(recipe, f, split.cards_from_gib([1.0] * 70), weights=weights)

    @pytest.mark.slow  # the GGUF reader parses the tiny pair's 248K-token vocabulary: 12 s
    def test_gguf_blocks_are_weighed_by_layer(self, tiny_pair: tuple[Path, Path]) -> None:
        w = fit.weights_from_files(*tiny_pair)
        assert len(w.layers) == recipes.load().geometry_at("tiny").target.num_hidden_layers
        assert sum(w.layers) + w.output == w.target_gpu and w.output > 0


# --- what `buun serve --gpus` hands llama-server ----------------------------------------------

class TestServe:
    def test_two_cards(self, two_cards: Path) -> None:
        s, _ = spec.resolve(None, **GIVEN, gpus=(0, 1))
        assert s.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}
        argv = s.argv
        assert value(argv, "-sm") == "layer" and value(argv, "-dev") == "CUDA0,CUDA1"
        assert value(argv, "-devd") == "CUDA1"
        counts = [int(n) for n in value(argv, "-ts").split(",")]
        assert sum(counts) == 65 and counts[1] < counts[0]  # the drafter's card holds fewer layers
        assert s.placement and s.placement["split"]["ts"] == value(argv, "-ts")
        assert s.context and "GPUs 0,1 split by layers" in s.context["why"]
        assert int(value(argv, "-c")) > 2 * fit.max_context(recipes.load(), fit.flags_from_recipe(recipes.load()),
                                                               24.0, weights=fit.default_weights(recipes.load(),
                                                                                                 Path("/m")))
        assert settings.child_env(None, s.env)["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert spec.LaunchSpec.from_json(json.loads(json.dumps(s.to_json()))) == s

    def test_the_drafter_on_another_card(self, two_cards: Path) -> None:
        s, _ = spec.resolve(None, **GIVEN, gpus=(0, 1), draft_gpu=0)
        counts = [int(n) for n in value(s.argv, "-ts").split(",")]
        assert value(s.argv, "-devd") == "CUDA0" and counts[0] < counts[1]
        # the order given is CUDA's: card 1 first
        s, _ = spec.resolve(None, **GIVEN, gpus=(1, 0))
        assert s.env["CUDA_VISIBLE_DEVICES"] == "1,0" and value(s.argv, "-devd") == "CUDA1"
        assert s.placement and s.placement["draft_gpu"] == 0

    def test_one_card_is_the_environment_alone(self, two_cards: Path) -> None:
        s, _ = spec.resolve(None, **GIVEN, gpus=(1,))
        assert s.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
        assert not any(command.canonical(a) in SPLIT_FLAGS for a in s.argv)
        weights = fit.default_weights(recipes.load(), Path("/m"))
        assert int(value(s.argv, "-c")) == fit.max_context(recipes.load(), fit.flags_from_recipe(recipes.load()),
                                                           24564 / 1024, weights=weights)  # the 4090's memory
        assert s.context and "NVIDIA GeForce RTX 4090" in s.context["why"]

    def test_without_gpus_nothing_changes(self, two_cards: Path) -> None:
        s, _ = spec.resolve(None, **GIVEN)
        assert s.env == {} and s.placement is None
        assert not any(command.canonical(a) in SPLIT_FLAGS for a in s.argv)

    def test_the_recipe_names_the_cards(self, two_cards: Path) -> None:
        path = _recipe_with(gpus=[0, 1])
        s, _ = spec.resolve(str(path), **GIVEN)
        assert s.env["CUDA_VISIBLE_DEVICES"] == "0,1" and "-ts" in s.argv
        s, _ = spec.resolve(str(path), **GIVEN, gpus=(1,))  # --gpus replaces it
        assert s.env["CUDA_VISIBLE_DEVICES"] == "1" and "-ts" not in s.argv

    def test_a_users_split_flags_are_kept_with_a_warning(self, two_cards: Path) -> None:
        r = CliRunner().invoke(app, ["serve", "--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--print-cmd",
                                     "--gpus", "0,1", "--", "-ts", "60,5", "--split-mode", "layer"])
        assert r.exit_code == 0, r.output
        out, err = r.stdout, flat(r.stderr)
        assert out.startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 ")
        argv = out.split()
        assert value(argv, "-ts") == "60,5" and argv.count("-ts") == 1 and "-sm" not in argv
        assert value(argv, "--split-mode") == "layer" and value(argv, "-devd") == "CUDA1"
        assert "warning: --gpus 0,1: keeping -sm layer -ts 60,5 from the flags; buun would pass -sm layer -ts" in err
        assert "-ts 60,5 at -c" in err and "overfills GPU0" in err  # 60 layers do not fit one 24 GB card


def _recipe_with(**server: object) -> Path:
    data = yaml.safe_load(recipes.load().source.read_text())
    data["name"] = "two-cards"
    data["server"].update(server)
    path = paths.config_dir() / "recipes" / "two-cards.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class TestRefusals:
    @pytest.mark.parametrize(("args", "message"), [
        (["--gpus", "0,0"], "--gpus 0,0: card 0 is listed twice"),
        (["--gpus", "0,x"], "--gpus 0,x: expected nvidia-smi card indices separated by commas"),
        # a digit to str.isdigit() that int() refuses: it was a ValueError traceback
        (["--gpus", "0,\u00b2"], "--gpus 0,\u00b2: expected nvidia-smi card indices separated by commas"),
        (["--", "-np", "\u00b2"], "-np \u00b2: expected a whole number"),
        (["--gpus", "0,2"], "--gpus 0,2: nvidia-smi lists no card 2 (cards here: 0 (NVIDIA GeForce RTX 3090), "
                            "1 (NVIDIA GeForce RTX 4090))"),
        (["--gpus", "0,1", "--draft-gpu", "2"], "--draft-gpu 2: not one of the cards the server runs on"),
        (["--draft-gpu", "1"], "--draft-gpu 1 needs the cards of the split"),
    ])
    def test_bad_cards(self, two_cards: Path, args: list[str], message: str) -> None:
        r = CliRunner().invoke(app, ["serve", *GIVEN_ARGS, "--print-cmd", *args])
        assert r.exit_code == 2 and message in flat(r.stderr), r.output

    def test_a_cpu_build_runs_on_no_card(self, two_cards: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_build(tmp_path / "other", "cpu")))
        r = CliRunner().invoke(app, ["serve", *GIVEN_ARGS, "--print-cmd", "--gpus", "0,1"])
        assert r.exit_code == 2 and "is a CPU build, which runs on no card" in flat(r.stderr)
        assert "buun build --cuda" in flat(r.stderr)

    def test_a_cpu_build_gets_the_default_context(self, two_cards: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        """A CPU build runs on no card: its -c is buun's default, not what fits the card nvidia-smi
        lists (111104 tokens of KV cache in host memory for a 24 GiB card), in serve and setup's plan."""
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_build(tmp_path / "other", "cpu")))
        s, _ = spec.resolve(None, **GIVEN)
        assert value(s.argv, "-c") == str(fit.FitFlags().ctx)
        assert s.context and "a CPU build of llama.cpp" in s.context["why"]
        r = CliRunner().invoke(app, ["setup", "--dry-run", "--models-dir", "/m"])
        assert r.exit_code == 0 and f"-c {fit.FitFlags().ctx} " in flat(r.stdout), r.output

    def test_a_cpu_build_offloads_no_layer(self, two_cards: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """A server on a CPU build got the recipe's -ngl 99 -ngld 99, layers for a card it cannot
        use; `buun setup --cpu` plans -ngl 0 -ngld 0, and now every launch on a CPU build gets them,
        the user's own value after `--` kept. A CUDA build keeps the recipe's."""
        assert value(spec.resolve(None, **GIVEN)[0].argv, "-ngl") == "99"  # two_cards: a CUDA build
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_build(tmp_path / "other", "cpu")))
        argv = spec.resolve(None, **GIVEN)[0].argv
        assert (value(argv, "-ngl"), value(argv, "-ngld")) == ("0", "0"), argv
        argv = spec.resolve(None, **GIVEN, extra=["--gpu-layers-draft", "3"])[0].argv
        assert (value(argv, "-ngl"), value(argv, "--gpu-layers-draft")) == ("0", "3") and "-ngld" not in argv, argv
        r = CliRunner().invoke(app, ["serve", *GIVEN_ARGS, "--print-cmd"])
        assert r.exit_code == 0 and "-ngl 0 " in flat(r.stdout) and "-ngld 0 " in flat(r.stdout), r.output

    def test_bench_runs_what_serve_runs_on_the_cards(self, two_cards: Path) -> None:
        """`buun bench --gpus 0,1` (or the recipe's server.gpus) gives every server serve's split."""
        r = recipes.load()
        where = devices.placement(r, (0, 1), None, two_cards / "llama-server")
        assert where is not None and where.env["CUDA_VISIBLE_DEVICES"] == "0,1"
        models = bench_configs.Models(Path("/m/t.gguf"), Path("/m/d.gguf"))
        for cfg in bench_configs.configs(ar=True, synthetic_al=[7.67]):
            argv = bench_configs.argv(r, cfg, models, two_cards / "llama-server", 9000, bench_configs.common(6048),
                                      Path("/m"), where)
            assert value(argv, "-sm") == "layer" and value(argv, "-dev") == "CUDA0,CUDA1"
            assert value(argv, "-devd") == "CUDA1" and value(argv, "-c") == "6048"
            if cfg.spec:  # AR's split has no drafter to leave room for
                served, _ = spec.resolve(None, **GIVEN, gpus=(0, 1), extra=["-c", "6048"])
                assert value(argv, "-ts") == value(served.argv, "-ts")
        plain = bench_configs.argv(r, cfg, models, two_cards / "llama-server", 9000, bench_configs.common(6048),
                                   Path("/m"))
        assert not any(command.canonical(a) in SPLIT_FLAGS for a in plain)

    def test_bench_refuses_cards_on_a_cpu_build(self, two_cards: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(fake_build(tmp_path / "other", "cpu")))
        r = CliRunner().invoke(app, ["bench", "--gpus", "0,1", "--target", "/m/t.gguf", "--drafter", "/m/d.gguf"])
        assert r.exit_code == 2 and "is a CPU build, which runs on no card" in flat(r.stderr), r.output

    def test_a_recipes_cards_are_checked_when_it_loads(self) -> None:
        for bad in ([0, 0], [-1], ["0"], 1):
            data = yaml.safe_load(recipes.load().source.read_text())
            data["server"]["gpus"] = bad
            with pytest.raises(recipes.RecipeError, match="server.gpus"):
                recipes.parse(Path("x.yaml"), data)


GIVEN_ARGS = ["--model", "/m/t.gguf", "--draft", "/m/d.gguf"]


# --- fit, doctor, build, status ---------------------------------------------------------------

class TestFitCommand:
    def fit(self, *args: str) -> dict:
        r = CliRunner().invoke(app, ["fit", *args, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    def test_gpu_mem_of_two_cards(self) -> None:
        one, two = self.fit("--gpu-mem", "24"), self.fit("--gpu-mem", "24,24")
        assert two["max_ctx"] >= 2 * one["max_ctx"] and two["cards_gib"] == [24.0, 24.0]
        big = two["split_at_max_ctx"]
        assert big["ctx"] == two["max_ctx"] and big["fits"] and big["draft_gpu"] == 1
        counts = [c["layers"] for c in big["cards"]]
        assert big["ts"] == ",".join(map(str, counts)) and counts[1] < counts[0]
        assert [c["range"] for c in big["cards"]] == [f"0-{counts[0] - 1}", f"{counts[0]}-63 + output"]
        for c in big["cards"]:
            assert c["total_bytes"] <= (24 - 0.25) * fit.GIB

    def test_the_table(self) -> None:
        r = CliRunner().invoke(app, ["fit", "--gpu-mem", "24,24"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        out = flat(r.stdout)
        for word in ("card", "layers", "weights", "KV", "state", "drafter", "buffers", "total GiB", "of GiB"):
            assert word in out
        assert "largest context: 262144 tokens" in out
        assert "`buun serve --gpus` passes -sm layer -ts 35,30 -dev CUDA0,CUDA1 -devd CUDA1" in out

    def test_cards_from_nvidia_smi(self, two_cards: Path) -> None:
        out = self.fit("--gpus", "0,1", "--draft-gpu", "0")
        cards = out["split"]["cards"]
        assert [c["name"] for c in cards] == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"]
        assert [c["gib"] for c in cards] == [24.0, 24564 / 1024] and out["split"]["draft_gpu"] == 0

    def test_the_recipes_cards(self, two_cards: Path) -> None:
        out = self.fit(str(_recipe_with(gpus=[1, 0])))
        assert [c["index"] for c in out["split"]["cards"]] == [1, 0] and out["split"]["draft_gpu"] == 0
        assert out["max_ctx"] == self.fit("--gpus", "1,0")["max_ctx"]

    def test_bad_cards(self, two_cards: Path) -> None:
        for args, message in ((["--gpus", "0,5"], "nvidia-smi lists no card 5"),
                              (["--gpu-mem", "24", "--gpus", "0,1"], "1 sizes for the 2 cards"),
                              (["--gpu-mem", "24,24", "--draft-gpu", "2"], "--draft-gpu 2: not one of the cards"),
                              (["--gpu-mem", "24,24", "--measure"], "--measure loads the split on real cards")):
            r = CliRunner().invoke(app, ["fit", *args])
            assert r.exit_code == 2 and message in flat(r.stderr), r.output


class TestHost:
    def test_nvidia_smi_lists_every_card_by_index(self, two_cards: Path) -> None:
        found = nvidia.detect_gpus()
        assert [(g.index, g.name, g.arch) for g in found] == [(0, RTX_3090[0], "86"), (1, "NVIDIA GeForce RTX 4090",
                                                                                       "89")]

    def test_doctor_one_line_per_card(self, two_cards: Path) -> None:
        checks = {c.name: c for c in doctor.check_gpu(cpu_only=True)}
        assert checks["gpu 0"].detail == "NVIDIA GeForce RTX 3090, compute 8.6, 24.0 GiB"
        assert checks["gpu 1"].detail == "NVIDIA GeForce RTX 4090, compute 8.9, 24.0 GiB"
        assert checks["driver"].detail == "580.65" and "gpu" not in checks
        archs = checks["gpu archs"]
        assert archs.status == "warn" and not archs.required and "CMAKE_CUDA_ARCHITECTURES=86;89" in archs.detail

    def test_one_card_one_line(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        write_nvidia_smi(tmp_path / "smi", [RTX_3090])
        monkeypatch.setenv("PATH", f"{tmp_path / 'smi'}:{__import__('os').environ['PATH']}")
        names = [c.name for c in doctor.check_gpu(cpu_only=True)]
        assert names[:2] == ["gpu", "driver"] and "gpu archs" not in names

    def test_a_driver_too_old_to_report_compute_capability(self, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
        # such a driver rejects the compute_cap field of the query; it still lists its cards
        smi = tmp_path / "smi" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text('#!/bin/sh\ncase "$1" in\n  -L) echo "GPU 0: Tesla P40 (UUID: GPU-1)"; exit 0 ;;\nesac\n'
                       'echo \'Field "compute_cap" is not a valid field to query.\' >&2; exit 2\n')
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{smi.parent}:{__import__('os').environ['PATH']}")
        assert nvidia.detect_gpus() == []
        (check,) = doctor.check_gpu(cpu_only=True)
        assert check.status == "warn" and "lists 1 GPU(s) but does not report their compute capability" in check.detail
        assert "update the NVIDIA driver" in check.fix

    @pytest.mark.parametrize(("cap", "nvcc_status"), [("6.1", "fail"), ("7.5", "ok"), ("8.6", "ok")])
    def test_cards_before_ampere_and_what_cuda_13_builds_for(self, cap: str, nvcc_status: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
        write_nvidia_smi(tmp_path / "smi", [("a card", cap, 24576)])
        monkeypatch.setenv("PATH", f"{tmp_path / 'smi'}:{__import__('os').environ['PATH']}")
        nvcc = tmp_path / "nvcc"
        nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
        nvcc.chmod(0o755)
        monkeypatch.setattr(build, "find_nvcc", lambda: str(nvcc))
        checks = {c.name: c for c in doctor.check_gpu(cpu_only=False)}
        assert checks["nvcc"].status == nvcc_status, checks["nvcc"]
        if nvcc_status == "fail":
            assert "CUDA 13.0 compiles for compute 7.5 (Turing) and newer: no code for GPU 0 (compute 6.1)" \
                in checks["nvcc"].detail and "CUDA 12" in checks["nvcc"].fix
        kernels = checks.get("gpu kernels")
        assert (kernels is not None) == (cap != "8.6")
        if kernels:
            assert kernels.status == "warn" and f"GPU 0 (compute {cap}) predates Ampere" in kernels.detail

    def test_the_build_covers_every_cards_arch(self, two_cards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
        p = build.plan(ui="none")
        assert p.variant == "cuda" and p.arch == "86;89" and "-DCMAKE_CUDA_ARCHITECTURES=86;89" in p.cmake_args
        # the stamp records it: a build for one of the cards is stale once the other is in
        monkeypatch.setattr(build, "find_nvcc", lambda: None)
        monkeypatch.setattr(build, "source_state", lambda src: {})
        monkeypatch.setattr(build, "_compiler_version", lambda: "c++ 13")
        monkeypatch.setattr(build.vendor, "load_pin", lambda: type("Pin", (), {"commit": "abc"})())
        assert build._stamp_for(p, Path("/src"))["arch"] == "86;89"

    def test_status_says_where_each_part_runs(self, two_cards: Path) -> None:
        s, _ = spec.resolve(None, **GIVEN, gpus=(0, 1))
        assert s.placement
        line = devices.describe(s.placement)
        counts = [int(n) for n in s.placement["split"]["ts"].split(",")]
        assert line == (f"GPU0 (NVIDIA GeForce RTX 3090), GPU1 (NVIDIA GeForce RTX 4090): layers 0-{counts[0] - 1} "
                        f"on GPU0, {counts[0]}-63 + output on GPU1; drafter on GPU1")
        one, _ = spec.resolve(None, **GIVEN, gpus=(1,))
        assert one.placement and devices.describe(one.placement) == \
            "GPU1 (NVIDIA GeForce RTX 4090) (CUDA_VISIBLE_DEVICES=1)"
        mem = nvidia.memory_for(4242)
        assert mem and mem.server_by_gpu == {"0": 500, "1": 500} and mem.server_mib == 1000

    def test_one_card_holds_the_servers_memory(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        write_nvidia_smi(tmp_path / "smi", [RTX_3090])
        monkeypatch.setenv("PATH", f"{tmp_path / 'smi'}{os.pathsep}{os.environ['PATH']}")
        mem = nvidia.memory_for(4242)
        assert mem and mem.server_by_gpu == {"0": 500} and mem.server_mib == 500


# --- the real llama-server ---------------------------------------------------------------------

@pytest.mark.slow
def test_the_cpu_build_takes_the_split_flags(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The CPU build has no CUDA0 to name, but it parses -sm layer and the -ts buun plans for the
    tiny pair over two cards (9 layers) and serves: the flags' spelling and form are llama-server's."""
    from tests.support.real_llama_server import llama_server

    r = recipes.load()
    plan = split.plan(r, replace(fit.flags_from_recipe(r), ctx=512), split.cards_from_gib([24, 24]), scale="tiny",
                      weights=fit.weights_from_plan(r, "tiny", "q4_k_m", "q4_k"))
    flags = dict(devices.split_flags(plan))
    assert sum(plan.counts) == 9 and flags["-dev"] == "CUDA0,CUDA1" and flags["-devd"] == "CUDA1"
    args = ["-m", str(tiny_pair[0]), "-md", str(tiny_pair[1]), "--spec-type", "dflash", "-c", "512",
            "-sm", flags["-sm"], "-ts", flags["-ts"], "-dev", "none", "-devd", "none", "--no-webui"]
    with llama_server(llama_bin, args, tmp_path / "split.log") as server:
        out = server.complete("Hello", 8)
        assert len(out["tokens"]) == 8


def test_status_prints_the_cards_and_each_ones_memory(two_cards: Path) -> None:
    from buun_tool.base import console
    from buun_tool.cli import server as server_cli
    from buun_tool.server import control
    from buun_tool.server.state import State

    s, _ = spec.resolve(None, **GIVEN, gpus=(0, 1))
    st = control.InstanceStatus("qwen", State.READY, True, placement=s.placement,
                                probes=control.Probes("ok", None, None, nvidia.memory_for(4242)))
    with console.out.capture() as cap:
        server_cli._print_status(st)
    out = flat(cap.get())
    assert s.placement and f"GPUs {devices.describe(s.placement)}" in out
    assert "GPU llama-server 1000 MiB (GPU0 500, GPU1 500); GPU0 1000/24576 MiB, GPU1 1000/24564 MiB" in out
    assert st.to_json()["placement"]["split"]["ts"] == s.placement["split"]["ts"]
