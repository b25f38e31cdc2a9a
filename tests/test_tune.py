"""`buun tune`: the pick rule, the tuned overlay (kept, keyed, stale, applied between the recipe and
the command line) and real tunes of the tiny pair on the CPU build under feigned acceptance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.app import tune as tune_app
from buun_tool.base import command
from buun_tool.base.errors import Exit, UsageError
from buun_tool.cli.app import app
from buun_tool.formats import recipes
from buun_tool.measure import bench_client, bench_request, treeprofile
from buun_tool.measure.bench_prompts import Prompt
from buun_tool.measure.tune import Measured, pick
from buun_tool.measure.tune_check import Verdict
from buun_tool.server import control, settings, tuned
from buun_tool.server.tuned import Choice, Key, Tuned

KEY = Key("qwen3.5-27b-dflash", "NVIDIA GeForce RTX 3090", "b1", "t1", "d1")


def m(choice: Choice, tps: float, greedy: Verdict | None = None) -> Measured:
    return Measured(choice, tps, None, None, None, greedy, 1.0)


AR, CHAIN, SHORT = Choice("ar"), Choice("chain", 15), Choice("chain", 8)
TREE15, TREE22 = Choice("tree", 15, 15), Choice("tree", 15, 22)


def test_the_fastest_is_picked_and_a_near_tie_goes_to_the_simpler() -> None:
    picked, why = pick([m(AR, 38), m(CHAIN, 110), m(TREE22, 120), m(SHORT, 90)], 15)
    assert picked.choice == TREE22 and why == "120.0 tok/s"
    picked, why = pick([m(AR, 38), m(CHAIN, 118), m(TREE22, 120), m(TREE15, 119)], 15)
    assert picked.choice == CHAIN and "within 2% of tree budget 22's 120.0 and simpler" in why
    picked, _ = pick([m(AR, 38), m(TREE15, 119.5), m(TREE22, 120)], 15)
    assert picked.choice == TREE15  # the shorter tree
    picked, _ = pick([m(AR, 38), m(SHORT, 100), m(CHAIN, 100)], 15)
    assert picked.choice == CHAIN  # of two chains alike, the recipe's length


def test_a_configuration_whose_greedy_output_differs_is_never_picked() -> None:
    differs, equal = Verdict(False, "code/0: token 3 is 7 where AR's is 9"), Verdict(True, "equal")
    picked, _ = pick([m(AR, 38), m(TREE22, 200, differs), m(CHAIN, 110, equal)], 15)
    assert picked.choice == CHAIN
    picked, why = pick([m(AR, 38), m(CHAIN, 110, differs)], 15)
    assert picked.choice == AR and why == "no DFlash configuration passed the greedy check"


def test_dflash_slower_than_ar_serves_ar_and_says_why() -> None:
    picked, why = pick([m(AR, 60), m(CHAIN, 15), m(SHORT, 20)], 15)
    assert picked.choice == AR
    assert why == "DFlash's best here, chain of 8, ran at 0.33x AR's 60.0 tok/s"
    with pytest.raises(UsageError, match="no configuration measured a decode speed"):
        pick([m(AR, 0)], 15)


def test_the_note_says_what_where_when_and_how_much() -> None:
    t = Tuned(KEY, TREE22, "2026-12-01", "code", 140.0, vs_ar=4.1, vs_chain=1.07)
    assert t.note == "tree budget 22 (tuned on NVIDIA GeForce RTX 3090, 2026-12-01: 1.07x the chain, 4.1x AR)"
    ar = Tuned(KEY, AR, "2026-12-01", "code", 38.0, reason="DFlash's best here ran at 0.90x AR's")
    assert ar.note == ("AR (no drafter) (tuned on NVIDIA GeForce RTX 3090, 2026-12-01: DFlash's best here ran at "
                       "0.90x AR's)")
    assert Tuned.from_json(json.loads(json.dumps(t.to_json()))) == t


def test_a_tune_is_kept_per_recipe_and_card_and_is_stale_when_its_key_moves() -> None:
    t = Tuned(KEY, CHAIN, "2026-12-01", "code", 110.0, vs_ar=2.9)
    path = tuned.save(t)
    assert path.name == "NVIDIA-GeForce-RTX-3090.json" and tuned.load(KEY.recipe, KEY.card) == t
    assert tuned.lookup(KEY).fresh == t and tuned.lookup(KEY).status() == t.note
    moved = Key(KEY.recipe, KEY.card, "b2", "t1", "d9")
    found = tuned.lookup(moved)
    assert found.fresh is None and found.stale == ["the build", "the drafter"]
    assert found.status() == ("stale: the build and the drafter changed since the tune of 2026-12-01, whose chain "
                              "of 15 is not applied; `buun tune qwen3.5-27b-dflash` measures again")
    other_card = tuned.lookup(Key(KEY.recipe, "NVIDIA H200", "b1", "t1", "d1"))
    assert other_card.tuned is None and other_card.status().startswith("not tuned on this card")
    path.write_text("{not json")
    assert tuned.load(KEY.recipe, KEY.card) is None  # unreadable: as if none
    tuned.save(t)
    assert tuned.clear(KEY.recipe) == [path] and not path.exists()


def test_a_fingerprint_changes_with_the_file(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(10 << 20))
    first = tuned.fingerprint(f)
    assert tuned.fingerprint(f) == first and tuned.fingerprint(None) == "none"
    assert tuned.fingerprint(tmp_path / "gone.gguf") == "missing"
    with f.open("r+b") as fh:  # the last tensors rewritten, same size
        fh.seek((10 << 20) - 8)
        fh.write(b"changed!")
    assert tuned.fingerprint(f) != first
    assert tuned.card_name([]) == "CPU" and tuned.card_name(["NVIDIA H200"] * 2) == "2x NVIDIA H200"


def _resolve(tuned_: Tuned | None, overrides: list[command.Flag] | None = None, tree_budget: int | None = None,
             ) -> settings.ServerSettings:
    return settings.resolve(recipes.load(), overrides or [("-c", "4096")], [], "the test", Path("/nonexistent"),
                            tree_budget=tree_budget, tuned=tuned_)


def test_the_tune_lies_between_the_recipe_and_the_command_line() -> None:
    tree = Tuned(KEY, TREE22, "2026-12-01", "code", 140.0, vs_ar=4.1, vs_chain=1.07)
    s = _resolve(tree)
    assert dict(s.flags)[command.TREE_BUDGET] == "22" and dict(s.flags)["--draft-max"] == "15"
    assert s.tuned == tree.note and s.drafter
    s = _resolve(tree, tree_budget=0)  # --tree-budget 0 wins
    assert command.TREE_BUDGET not in dict(s.flags) and s.tuned.endswith("the command line overrides part of it")
    s = _resolve(Tuned(KEY, SHORT, "2026-12-01", "code", 100.0))
    assert dict(s.flags)["--draft-max"] == "8" and command.TREE_BUDGET not in dict(s.flags)
    s = _resolve(Tuned(KEY, SHORT, "2026-12-01", "code", 100.0), [("-c", "4096"), ("--draft-max", "12")])
    assert dict(s.flags)["--draft-max"] == "12"
    untuned = _resolve(None)
    assert untuned.tuned is None and dict(untuned.flags)["--draft-max"] == "16"


def test_a_tune_that_picked_ar_serves_no_drafter_unless_the_command_line_asks() -> None:
    ar = Tuned(KEY, AR, "2026-12-01", "code", 60.0, reason="DFlash's best here ran at 0.33x AR's")
    s = _resolve(ar)
    assert not s.drafter and not set(dict(s.flags)) & set(tuned.DRAFT_OPTIONS)
    argv = s.render("llama-server", "t.gguf", "d.gguf", "127.0.0.1", 8080).argv
    assert "-md" not in argv and "d.gguf" not in argv
    for cmdline in ([("--spec-type", "dflash")], [("-cd", "512")]):
        s = _resolve(ar, [("-c", "4096"), *cmdline])
        assert s.drafter and "not applied, the command line sets the drafter" in (s.tuned or "")
    assert _resolve(ar, tree_budget=22).drafter


@pytest.mark.parametrize(("value", "expect"), [
    ("calibrated", treeprofile.synth_tree_value(treeprofile.DEFAULT)),
    ("real", None),
    ("0.28:0.68", treeprofile.synth_tree_value(treeprofile.Profile(0.28, 0.68))),
    ("0.5:1,0:0,1", "0.5:1,0:0,1"),
])
def test_the_tree_profile_is_read(value: str, expect: str | None) -> None:
    assert tune_app.parse_profile(value, Path("real.gguf")) == expect


@pytest.mark.parametrize("value", ["0.5", "2:0.5", "0.5:0.95", "x:y", "0.5:1,0:0", "0.5:0.9,0.2:0.1,0.1"])
def test_a_tree_profile_that_is_not_one_is_refused(value: str) -> None:
    with pytest.raises(UsageError, match="--tree-profile"):
        tune_app.parse_profile(value, Path("real.gguf"))


def test_the_forms_of_request() -> None:
    p = Prompt("code", "c/0", "def f():")
    assert bench_client.request_body(p, "chat-nothink", 8, 1)[1]["chat_template_kwargs"] == {"enable_thinking": False}
    sampled = bench_client.request_body(p, "chat-sampled", 8, 1)[1]
    assert sampled["temperature"] == 0.7 and sampled["top_p"] == 0.95 and sampled["seed"] == 1
    assert bench_client.request_body(p, "raw", 8, 1)[1]["temperature"] == 0.0
    assert bench_request.BenchRequest(mode="raw,chat-sampled").modes == ("raw", "chat-sampled")
    with pytest.raises(UsageError, match="--mode"):
        bench_request.BenchRequest(mode="chat-hot")


def test_status_shows_the_tune_of_a_launch(tmp_path: Path) -> None:
    """A launch records the tune it applied; status adds whether the recipe's tune is still fresh."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("")
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"t")
    draft.write_bytes(b"d")
    key = tuned.key_for(KEY.recipe, tuned.cards_of(None, cpu_build=False), binary, target, draft)
    t = Tuned(key, AR, "2026-12-01", "code", 60.0, reason="slower")
    tuned.save(t)
    launch = {"recipe": KEY.recipe, "binary": str(binary), "target": str(target), "draft": str(draft),
              "tuned": t.note, "serves_ar": True}
    assert control.tuned_of(launch) == {"applied": t.note, "serves_ar": True, "now": t.note, "stale": []}
    draft.write_bytes(b"another drafter")
    assert control.tuned_of(launch)["stale"] == ["the drafter"]


# --- real tunes (the CPU build, the tiny pair, feigned acceptance) ----------------------------------

# A tune's servers run one thread each (llama-server's -t, through its environment): a tune picks by
# measured speeds, and two threads on a 2-core machine that runs something else wait at every op for
# a partner the scheduler has put off; beside a llama.cpp build their tok/s swung up to 10x from one
# request to the next and the picks followed (docs/development.md). One thread is ~1.5x slower on a
# quiet machine and as fast beside a build.
ONE_THREAD = {"LLAMA_ARG_THREADS": "1"}


def _tune(pair: tuple[Path, Path], *args: str) -> dict:
    target, drafter = pair
    res = CliRunner().invoke(app, ["tune", "--target", str(target), "--drafter", str(drafter), "--prompts", "1",
                                   "--n-predict", "64", "--json", *args], env=ONE_THREAD)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture
def own_pair(tiny_pair: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the tiny pair this test may change."""
    return tuple(Path(shutil.copy(p, tmp_path / p.name)) for p in tiny_pair)  # type: ignore[return-value]


@pytest.mark.slow
def test_a_tune_that_finds_dflash_slower_serves_ar_within_its_budget(own_pair: tuple[Path, Path],
                                                                     llama_bin: Path) -> None:
    """Acceptance feigned at nothing (U 1, the top-1 never right), chains only, a budget of 1 s: AR
    and the recipe's chain are measured, the shorter chain is cut and said so; AR is picked and
    served without -md, with the reason; the command line brings the drafter back; a changed
    drafter makes the tune stale."""
    out = _tune(own_pair, "--tree-profile", "1:0", "--tree-budget", "0", "--budget-s", "1")
    assert [r["config"] for r in out["measured"]] == ["ar", "dflash-chain15"] and out["cut"] == ["chain of 8"]
    assert out["picked"] == "ar" and out["why"].startswith("DFlash's best here, chain of 15, ran at 0.")
    assert out["tuned"]["choice"]["kind"] == "ar" and Path(out["files"]["bench"]).is_file()
    target, drafter = own_pair
    serve = ["serve", "--model", str(target), "--draft", str(drafter), "--print-cmd"]
    res = CliRunner().invoke(app, serve)
    assert res.exit_code == 0 and "-md" not in res.stdout and "--spec-type" not in res.stdout
    assert "tuned: AR (no drafter) (tuned on CPU, " in res.stderr
    res = CliRunner().invoke(app, [*serve, "--", "--spec-type", "dflash"])
    assert "-md" in res.stdout and "not applied, the command line sets the drafter" in res.stderr
    with drafter.open("ab") as f:
        f.write(b"\0" * 64)
    res = CliRunner().invoke(app, serve)
    assert "-md" in res.stdout and "tuned: stale: the drafter changed since the tune of" in res.stderr


@pytest.mark.slow
def test_a_tune_picks_the_chain_where_trees_add_nothing(tiny_pair_f32: tuple[Path, Path], llama_bin: Path) -> None:
    """Every depth easy (U 0): the chain of 15 accepts nearly all of it (AL 15.75), a tree of 22 no
    more but verifies 23 rows against 16; the pick is a chain, and the bench.json beside it reads as
    a bench run's. (A tree of 15 verifies the chain's 16 rows: its speed is the chain's, and which
    of two equals wins by more than the 2% tie is noise.) The f32 pair of the small vocabulary: there
    the chain decodes at ~2x AR (572.6 and 703.1 tok/s against 292.3 and 343.2, beside a build); on
    the Q4 pair, whose 248K-row head makes a step cost ~13 AR steps, it led by 1.23x, which the swings
    of a busy machine flipped once (AR picked, the suite beside a looping build, 2026-11-30)."""
    out = _tune(tiny_pair_f32, "--tree-profile", "0:0.68", "--tree-budget", "22", "--budget-s", "600")
    assert [r["config"] for r in out["measured"]] == ["ar", "dflash-chain15", "dflash-tree22", "dflash-chain8"]
    assert out["tuned"]["choice"]["kind"] == "chain" and out["cut"] == [], (out["why"], out["measured"])
    forms = {f["form"] for f in out["forms"]}
    assert forms == {"raw", "chat", "chat-sampled"}
    data = json.loads(Path(out["files"]["bench"]).read_text())
    assert {c["name"] for c in data["configs"]} == {r["config"] for r in out["measured"]}


@pytest.mark.slow
def test_a_tree_that_accepts_more_outruns_the_chain(tiny_pair: tuple[Path, Path], llama_bin: Path) -> None:
    """Half the depths hard, where the drafter's second candidate is always the target's: a tree of
    40 accepts about twice the chain's tokens a step and decodes faster. On the tiny pair a DFlash
    step costs ~6 AR steps (the 248K-row output matrix dominates a tiny model), so AR stays ahead
    here; the GPU run of docs/performance.md shows the tree picked where it wins outright."""
    out = _tune(tiny_pair, "--tree-profile", "0.5:1,0:0,1", "--tree-budget", "40", "--budget-s", "600")
    rows = {r["config"]: r for r in out["measured"]}
    tree, chain = rows["dflash-tree40"], rows["dflash-chain15"]
    assert tree["mean_al"] > 1.5 * chain["mean_al"] and tree["decode_tps"] > chain["decode_tps"]
    fastest = max(out["measured"], key=lambda r: r["decode_tps"])
    assert out["picked"] == fastest["config"] or fastest["decode_tps"] < 1.02 * rows[out["picked"]]["decode_tps"]


def test_a_workload_that_is_not_one_is_refused_before_anything_is_looked_for(tmp_path: Path) -> None:
    """`--workload` is checked first: no models are downloaded here, and the error names the option."""
    res = CliRunner().invoke(app, ["tune", "--workload", "poetry", "--models-dir", str(tmp_path)])
    assert res.exit_code == Exit.USAGE, res.output
    assert "--workload 'poetry': expected one of code, " in res.output and "not downloaded" not in res.output


def test_the_models_given_are_files_that_are_there(tmp_path: Path) -> None:
    """--target and --drafter are checked as bench checks them, before anything is measured: a
    folder is named a folder, a missing file missing, and one without the other is refused."""
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    for args, said in ((["--target", str(tmp_path), "--drafter", str(gguf)], f"--target {tmp_path} is a folder"),
                       (["--target", str(gguf), "--drafter", str(tmp_path / "no.gguf")],
                        f"--drafter {tmp_path / 'no.gguf'} does not exist"),
                       (["--target", str(gguf)], "--target and --drafter go together")):
        res = CliRunner().invoke(app, ["tune", "--models-dir", str(tmp_path), *args])
        assert res.exit_code == Exit.USAGE, res.output
        assert said in " ".join(res.output.split()), res.output
