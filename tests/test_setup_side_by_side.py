"""`buun setup` downloads while it builds: the pull (then drafter) runs in a process of its own beside
vendor -> patch -> build, and convert waits for both (app/side_by_side.py).

Real parts where they are quick: the fake Hub (tests/support/fake_hub.py) and the real
huggingface_hub client for the pull, a stand-in llama.cpp checkout (fake_llama_source.py) for vendor
and patch, and real processes for the build's lane (proc.run_logged, which the build runs its cmake
through). The Hub holds the target's download at its half until the test lets it go on, so each
test knows what the other lane is doing at that moment."""

from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from buun_tool.app import setup
from buun_tool.app.setup import Stage
from buun_tool.base import paths
from buun_tool.base.errors import INTERRUPTED, BuunError, CommandError, Exit
from buun_tool.base.proc import run_logged
from buun_tool.formats import layout, recipes
from buun_tool.pipeline import patches, pull, vendor
from buun_tool.pipeline.pull_manifest import read_manifest
from tests.support import waits
from tests.support.fake_hub import Cut, FakeHub
from tests.support.fake_llama_source import FakeProject, commit_change, hold_git_am, wait_for_file
from tests.support.lock_holder import buun, finish
from tests.support.tiny_checkpoints import write_recipe
from tests.test_pull import DRAFTER, GGUF, TARGET, _bytes
from tests.test_pull import hub as hub  # noqa: F401 (the fixture: small repos under the recipe's names)

BIG = 24 << 20  # the target: the client gets its first 10 MiB piece, then the Hub holds the rest
PIECE = 10 << 20  # huggingface_hub's piece: what a partial file holds while the Hub holds the rest
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what a terminal acts on: ESC, CR, ...


@pytest.fixture
def held(hub: FakeHub) -> threading.Event:  # noqa: F811
    """The target GGUF made big enough to be caught half way: the Hub sends its first half, then
    waits for the event (a minute at most). Set at the end, so that no download waits on."""
    hub.add_repo(TARGET, {GGUF: _bytes(BIG, 7), "README.md": b"# target\n"})
    gate = hub.stalls[(TARGET, GGUF)] = threading.Event()
    yield gate
    gate.set()


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> recipes.Recipe:
    with monkeypatch.context() as m:  # the recipe it is made from is this checkout's, not fake_project's
        m.delenv("BUUN_ROOT", raising=False)
        return recipes.load_file(write_recipe(tmp_path / "tiny.yaml"))


def _target(recipe: recipes.Recipe) -> Path:
    return layout.for_recipe(recipe, paths.models_dir()).target_gguf


def _partial(recipe: recipes.Recipe) -> int:
    """The bytes of the target's partial file (0: none)."""
    parts = list((layout.for_recipe(recipe, paths.models_dir()).target_dir / pull.PARTIAL_DIR).glob("*.part"))
    return parts[0].stat().st_size if parts else 0


def _stages(build_run) -> tuple[Stage, ...]:
    """setup's stages from vendor to pull, with the build's own run replaced: the build of llama.cpp
    takes minutes; the processes it runs are what a stop acts on, and those are real here."""
    by_name = {s.name: s for s in setup.STAGES}
    build = replace(by_name["build"], run=build_run, status=None)
    return by_name["vendor"], by_name["patch"], build, by_name["pull"]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _nothing_left(before: set[int]) -> None:
    """No process setup started left running (the downloads', the build's), nor its reading thread."""
    assert _children() <= before
    assert not any(t.name == "buun-setup-downloads" for t in threading.enumerate())


def test_the_download_runs_while_the_build_does(held: threading.Event, fake_project: FakeProject,
                                                 recipe: recipes.Recipe, capfd: pytest.CaptureFixture[str]) -> None:
    """The build's lane finishes only once the target is half downloaded, and the Hub sends the
    rest only once the build runs: in STAGES' order, one after the other, neither could."""
    seen: dict[str, object] = {}

    def build_run(ctx: setup.Context) -> None:
        waits.until(lambda: _partial(recipe) >= PIECE, 30, "the target half downloaded while the build runs")
        seen["partial"] = _partial(recipe)
        seen["target"] = _target(recipe).exists()
        run_logged(["sh", "-c", "echo '[1/2] compiling'; echo '[2/2] linking'"], paths.build_dir("cpu") / "build.log",
                   what="llama.cpp build")
        held.set()

    ctx = setup.Context(recipe, paths.models_dir(), cpu=True)
    results = setup.run_stages(ctx, _stages(build_run))
    assert seen == {"partial": PIECE, "target": False}
    assert _target(recipe).read_bytes() == _bytes(BIG, 7)
    assert results["pull"] is not None and results["vendor"] is not None
    err = capfd.readouterr().err
    # what a log shows: the stages' lines and the download's own progress lines, nothing for a terminal
    assert "==> build:" in err and "==> pull:" in err and "ok target:" in err, err
    assert re.search(r"^pull: 10\.0 MiB of [\d.]+ MiB \(\d+%\), [\d.]+ [MG]iB/s", err, re.M), err
    assert not CONTROL.search(err.replace("\n", "")), repr(err)
    assert ctx.downloads is None  # setup's progress is pull's again


def test_a_failed_download_stops_the_build(held: threading.Event, hub: FakeHub,  # noqa: F811
                                           fake_project: FakeProject, recipe: recipes.Recipe,
                                           tmp_path: Path) -> None:
    """The drafter's weights answer HTTP 503 while the build compiles: the build's processes are
    stopped at once and setup fails with the download's error and exit code; the target, downloaded
    and verified before, stays."""
    hub.cuts[(DRAFTER, "model.safetensors")] = Cut(after=0, times=0, then_status=503, then_times=100)
    build_log = tmp_path / "build.log"

    def build_run(ctx: setup.Context) -> None:
        # a compile that takes a minute; its first line lets the target's download go on
        run_logged(["sh", "-c", "echo '[1/9] compiling'; exec sleep 60"], build_log, what="llama.cpp build",
                   on_line=lambda line: held.set())

    t0, before = time.monotonic(), _children()
    with pytest.raises(BuunError) as failed:
        setup.run_stages(setup.Context(recipe, paths.models_dir(), cpu=True), _stages(build_run))
    assert time.monotonic() - t0 < 30
    assert failed.value.exit_code == Exit.NETWORK and "HTTP 503" in failed.value.message, failed.value
    assert "model.safetensors" in failed.value.message
    _nothing_left(before)  # the build's `sleep` was stopped, not left to run
    assert "[1/9] compiling" in build_log.read_text()
    assert _target(recipe).read_bytes() == _bytes(BIG, 7)  # nothing previously good is lost
    manifest = read_manifest(_target(recipe).parent)
    assert manifest is not None and GGUF in manifest["files"]


def test_a_failed_build_stops_the_download(held: threading.Event, hub: FakeHub,  # noqa: F811
                                           fake_project: FakeProject, recipe: recipes.Recipe,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    """The build fails while the target is half downloaded (the Hub sends nothing more): setup fails
    with the build's error at once, the download is stopped, and the next pull resumes from its
    partial file."""

    def build_run(ctx: setup.Context) -> None:
        waits.until(lambda: _partial(recipe) >= PIECE, 30, "the target half downloaded while the build runs")
        run_logged(["sh", "-c", "echo 'error: no such target' >&2; exit 2"], paths.build_dir("cpu") / "build.log",
                   what="llama.cpp build")

    t0, before = time.monotonic(), _children()
    with pytest.raises(CommandError) as failed:
        setup.run_stages(setup.Context(recipe, paths.models_dir(), cpu=True), _stages(build_run))
    assert time.monotonic() - t0 < 30  # the Hub holds the rest for a minute: the stop did not wait for it
    assert "llama.cpp build failed (exit 2)" in failed.value.message and failed.value.exit_code == Exit.FAILED
    _nothing_left(before)
    held.set()
    assert _partial(recipe) == PIECE and not _target(recipe).exists()  # kept, never placed unverified
    err = capfd.readouterr().err
    assert not re.search("^(error|hint):", err, re.M), err  # the CLI prints the one raised, nothing else does
    hub.log.clear()
    pull.pull(recipe, paths.models_dir())
    assert [g["range"] for g in hub.requests("GET", "resolve") if g["path"].endswith(GGUF)] == [f"bytes={PIECE}-"]
    assert _target(recipe).read_bytes() == _bytes(BIG, 7)


def _stage(name: str, run) -> Stage:
    return Stage(name, f"the {name} stage", run)


def test_when_both_fail_both_are_said_and_the_first_decides(capfd: pytest.CaptureFixture[str],
                                                            recipe: recipes.Recipe, tmp_path: Path) -> None:
    """The build fails; then, before setup's stop reaches it (its process holds SIGTERM back for a
    moment), the download fails on its own: the build's error is raised (the first: its exit code is
    setup's), and the download's is printed before it."""
    pulling, built = tmp_path / "pulling", tmp_path / "build failed"

    def build_run(ctx: setup.Context) -> None:
        waits.until(pulling.exists, 30, "the download to start")
        built.touch()
        raise BuunError("the build broke", "see the build log", Exit.FAILED)

    def pull_run(ctx: setup.Context) -> None:  # in the downloads' process
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pulling.touch()
        waits.until(built.exists, 30, "the build to fail")
        time.sleep(0.3)
        raise BuunError("the disk is full", "free some space", Exit.DISK)

    stages = (_stage("build", build_run), _stage("pull", pull_run))
    with pytest.raises(BuunError) as failed:
        setup.run_stages(setup.Context(recipe, paths.models_dir()), stages)
    assert failed.value.message == "the build broke" and failed.value.exit_code == Exit.FAILED
    err = capfd.readouterr().err
    assert "error: pull: the disk is full" in err and "hint: free some space" in err, err


def test_the_plan_says_what_runs_at_the_same_time() -> None:
    rows = [setup.PlanRow(stage, action, stage[0]) for stage, action in
            (("vendor", "skip"), ("build", "run"), ("pull", "run"), ("drafter", "run"), ("convert", "run"))]
    assert [r.what for r in setup._beside(rows)] == ["v", "b", "p (at the same time as build)",
                                                     "d (at the same time as build)", "c"]
    built = [replace(r, action="skip") if r.stage == "build" else r for r in rows]
    assert setup._beside(built) == built  # nothing to build: the downloads run alone
    # the order of the stages is STAGES', and the lanes are two stretches of it
    names = [s.name for s in setup.STAGES]
    for lane in setup.BESIDE:
        start = names.index(lane[0])
        assert tuple(names[start:start + len(lane)]) == lane
    assert names.index(setup.BESIDE[0][-1]) + 1 == names.index(setup.BESIDE[1][0])


# --- the command itself ----------------------------------------------------------------------

def _setup_command(recipe: recipes.Recipe):
    return buun("setup", "--recipe-file", str(recipe.source), "--cpu", "--yes")


def test_setup_fails_with_the_builds_error_and_keeps_the_download(held: threading.Event, hub: FakeHub,  # noqa: F811
                                                                  fake_project: FakeProject,
                                                                  recipe: recipes.Recipe) -> None:
    """`buun setup` itself, its output a pipe: the real build of the stand-in tree fails (it has no
    llama-server to build) while the target's download is half way. Exit 1 with the build's error,
    the partial download kept; plain lines, no control codes. (One after the other in STAGES'
    order, the build would have failed before any download; the pull first, the Hub would have held
    setup for a minute and the target would be whole.)"""
    proc = _setup_command(recipe)
    code, err = finish(proc)
    assert code == Exit.FAILED, err
    assert "error: llama.cpp build failed" in err or "error: cmake configure failed" in err, err
    assert "Traceback" not in err and "HTTP" not in err, err
    assert _partial(recipe) == PIECE and not _target(recipe).exists()
    assert re.search(r"^pull: 10\.0 MiB of [\d.]+ MiB \(\d+%\)", err, re.M), err
    assert not CONTROL.search(err.replace("\n", "")), repr(err)


def test_ctrl_c_stops_both_lanes(held: threading.Event, hub: FakeHub, fake_project: FakeProject,  # noqa: F811
                                 recipe: recipes.Recipe, tmp_path: Path) -> None:
    """SIGINT while the patch stage applies its series (held in `git am`) and the target's download
    is half way: exit 130 at once with the one line; the series is left for the next run to finish,
    and the download resumes from its partial file."""
    vendor.vendor()
    commit_change(fake_project.llama, "common/arg.cpp", "int option_1 = 1;", "int option_1 = 11;", "arg: a change")
    patches.export()
    patches.reverse()
    gate = tmp_path / "go"
    started = hold_git_am(fake_project.llama, gate)
    proc = _setup_command(recipe)
    try:
        wait_for_file(started, 60)
        waits.until(lambda: _partial(recipe) >= PIECE, 60, "the target half downloaded while the patch stage runs")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, err = finish(proc)
    finally:
        gate.touch()
    assert code == Exit.INTERRUPTED, err
    assert time.monotonic() - t0 < 15
    assert err.strip().splitlines()[-1] == INTERRUPTED and "Traceback" not in err, err
    assert _partial(recipe) == PIECE and not _target(recipe).exists()
    held.set()
    code, err = finish(buun("patch"))  # ends the `git am` the stop left
    assert code == 0 and [s.state for s in patches.status()] == ["applied"], err
    hub.log.clear()
    pull.pull(recipe, paths.models_dir())
    assert [g["range"] for g in hub.requests("GET", "resolve") if g["path"].endswith(GGUF)] == [f"bytes={PIECE}-"]
