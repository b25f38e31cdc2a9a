"""`buun setup --cpu` end to end: the local Hub endpoint, the tiny model pair, the real CPU build.

The vendor, patch and build stages act on this checkout's own vendored tree and CPU build (made
by `make dev` before the tests): they must find everything done and return in seconds.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
import yaml

from buun_tool.base import paths
from buun_tool.formats import layout, recipes
from buun_tool.pipeline import build
from buun_tool.server import control
from buun_tool.server.instance import Instance, all_instances
from buun_tool.server.process import free_port
from tests.support.fake_hub import FakeHub
from tests.support.tiny_checkpoints import DRAFTER_REPO, write_recipe

pytestmark = pytest.mark.slow


@pytest.fixture
def setup_env(tiny_hub: FakeHub, tmp_path: Path, llama_bin: Path):
    """A recipe file for the tiny pair on the fake Hub, and a port; stops every server afterwards."""
    recipe_file = write_recipe(tmp_path / "tiny-dflash.yaml")
    port = free_port()
    yield recipe_file, port
    for inst in all_instances():
        control.stop(inst, 10)


# On the GPU machine (BUUN_TEST_NGL set, see `scripts/gpu_run.sh setup`) setup builds and serves with CUDA.
CPU = [] if os.environ.get("BUUN_TEST_NGL") else ["--cpu"]


def run_setup(recipe_file: Path, port: int, *extra: str, timeout: float = 900, tune: bool = False
              ) -> subprocess.CompletedProcess[str]:
    """`buun setup`, its tune stage left out unless `tune` (test_setup_runs_then_skips_everything
    tunes, with a budget of its own)."""
    cmd = [sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe_file), *CPU, "--yes",
           "--port", str(port), *([] if tune else ["--no-tune"]), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def ran(proc: subprocess.CompletedProcess[str], stage: str) -> bool:
    return f"==> {stage}:" in proc.stderr


def skipped(proc: subprocess.CompletedProcess[str], stage: str) -> bool:
    return f"{stage}: current, skipped (" in proc.stderr


def assert_every_stage_has_a_result_line(stderr: str) -> None:
    """A skipped stage says so; one that ran prints an `ok` line before the next stage of its own lane
    starts (setup.BESIDE: the downloads' lines come between the build's, so there a line of the other
    lane's may stand for it)."""
    from buun_tool.app.setup import BESIDE, STAGES

    headers = {f"==> {s.name}: {s.what}": s.name for s in STAGES}  # pull's own `==> drafter: ...` is no stage
    headers["==> smoke test:"] = "smoke test"
    starts = sorted((m.start(), headers[m.group(0)])
                    for m in re.finditer("^(" + "|".join(map(re.escape, headers)) + ")", stderr, re.M))
    other = {name: set(BESIDE[1 - i]) for i, lane in enumerate(BESIDE) for name in lane}
    segments = {name: stderr[a:next((b for b, later in starts if b > a and later not in other.get(name, ())),
                                    len(stderr))] for a, name in starts}
    for stage in STAGES:
        if f"{stage.name}: current, skipped (" in stderr:
            continue
        assert re.search(r"^ok ", segments.get(stage.name, ""), re.M), (stage.name, segments.get(stage.name))


def test_setup_runs_then_skips_everything(setup_env: tuple[Path, int]) -> None:
    recipe_file, port = setup_env
    first = run_setup(recipe_file, port)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"http://127.0.0.1:{port}" in first.stdout and "smoke test" in first.stdout
    for stage in ("pull", "drafter", "convert", "serve"):
        assert ran(first, stage), stage
    assert_every_stage_has_a_result_line(first.stderr)
    # the server it started answers
    r = requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["timings"]["draft_n"] >= 0
    # and holds none of the stages' locks: a pull or a convert of the models it serves need not wait
    fd = os.open(paths.models_dir() / ".buun.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)

    t0 = time.monotonic()
    second = run_setup(recipe_file, port)
    assert second.returncode == 0, second.stderr[-3000:]
    for stage in ("vendor", "patch", "pull", "drafter", "convert"):
        assert skipped(second, stage), (stage, second.stderr[-2000:])
    assert "already running" in second.stderr
    print(f"second run: {time.monotonic() - t0:.1f} s")

    # a key after `--` (or a recipe's): the server got it and the smoke test asked without it, HTTP 401
    for inst in all_instances():
        control.stop(inst, 10)
    keyed = run_setup(recipe_file, port, "--", "--api-key", "sekrit")
    assert keyed.returncode == 0, keyed.stderr[-3000:]
    assert "sekrit" not in keyed.stdout + keyed.stderr and 'api_key="<your key>"' in keyed.stdout
    assert requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 1},
                         timeout=60).status_code == 401

    # a tune of the pair (one the budget cuts short), then setup without --no-tune: the tune stage is
    # current, the server restarts with the pick, and the last line says what it measured here
    for inst in all_instances():
        control.stop(inst, 10)
    tuned = subprocess.run([sys.executable, "-m", "buun_tool", "tune", str(recipe_file), "--budget-s", "1",
                            "--prompts", "1", "--n-predict", "16", "--json"], capture_output=True, text=True,
                           timeout=600)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    note = json.loads(tuned.stdout)["tuned"]
    third = run_setup(recipe_file, port, tune=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert skipped(third, "tune") and "measured on this card: " in third.stderr.splitlines()[-1]
    assert f"tuned on CPU, {note['date']}" in third.stdout


def test_interrupted_conversion_resumes(setup_env: tuple[Path, int]) -> None:
    recipe_file, port = setup_env
    cmd = [sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe_file), *CPU, "--yes",
           "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("==> convert:"):
            break
    else:
        pytest.fail("setup ended before the convert stage:\n" + "".join(seen[-30:]))
    _wait_for_converter(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # power loss: setup and the converter die at once
    proc.wait()
    recipe = recipes.load_file(recipe_file)
    final = layout.for_recipe(recipe, paths.models_dir()).drafter_gguf()
    assert not final.exists()  # nothing half-written under the final name

    again = run_setup(recipe_file, port)
    assert again.returncode == 0, again.stderr[-3000:]
    assert skipped(again, "pull") and skipped(again, "drafter") and ran(again, "convert")
    assert final.is_file()


def _wait_for_converter(setup_pid: int, timeout: float = 120) -> None:
    """Until the converter runs under setup: the kill must land in the middle of the conversion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(setup_pid).children(recursive=True):
            try:
                if any("convert_hf_to_gguf.py" in part for part in child.cmdline()):
                    return
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    pytest.fail("the converter never started")


def test_changed_revision_redoes_pull_and_convert_only(setup_env: tuple[Path, int], tiny_hub: FakeHub,
                                                       tiny_models_built) -> None:
    recipe_file, port = setup_env
    assert run_setup(recipe_file, port).returncode == 0
    # a new revision of the drafter repo (other content: another commit), and the recipe pinned to it
    files = dict(tiny_models_built.hub_repos()[DRAFTER_REPO])
    config = json.loads(Path(files["config.json"]).read_bytes() if isinstance(files["config.json"], Path)
                        else files["config.json"])
    files["config.json"] = json.dumps({**config, "buun_test_revision": 2}, indent=2).encode()
    tiny_hub.add_repo(DRAFTER_REPO, files, branches=("main", "v2"))
    data = yaml.safe_load(recipe_file.read_text())
    data["drafter"]["revision"] = "v2"
    recipe_file.write_text(yaml.safe_dump(data, sort_keys=False))
    again = run_setup(recipe_file, port)
    assert again.returncode == 0, again.stderr[-3000:]
    assert skipped(again, "vendor") and skipped(again, "patch")
    assert ran(again, "pull") and ran(again, "convert")


def test_dry_run_changes_nothing(setup_env: tuple[Path, int]) -> None:
    recipe_file, port = setup_env
    out = run_setup(recipe_file, port, "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "to download" in out.stdout and "server command:" in out.stdout and "--spec-type dflash" in out.stdout
    recipe = recipes.load_file(recipe_file)
    assert not layout.for_recipe(recipe, paths.models_dir()).target_gguf.exists()
    assert not all_instances()


def _plan_rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The dry run's table: stage -> (action, what)."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^\s*(\w+)\s+(skip|run|check)\s+(.*)$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3).strip())
    return rows


def _buun(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "buun_tool", *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


def test_dry_run_shows_what_would_really_run(setup_env: tuple[Path, int]) -> None:
    recipe_file, port = setup_env
    before = _plan_rows(run_setup(recipe_file, port, "--dry-run").stdout)
    assert [before[s][0] for s in ("doctor", "pull", "drafter", "convert", "serve")] == \
        ["check", "run", "run", "run", "run"]
    # done by other routes than setup: `make dev` made the tree and the build, these the models
    for stage in ("pull", "drafter", "convert"):
        _buun(stage, str(recipe_file))
    out = run_setup(recipe_file, port, "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = _plan_rows(out.stdout)
    for stage in ("vendor", "patch", "pull", "drafter", "convert"):
        assert rows[stage][0] == "skip", (stage, out.stdout)
    # skipped when the tree is as `make dev` built it (a developer's uncommitted edits make it run)
    if CPU:
        want = "skip" if build.stage_status(build.plan(cpu=True)).current else "run"
        assert rows["build"] == (want, "build llama.cpp for the CPU")
    assert "to download" not in out.stdout  # nothing to fetch: no sizes asked of the Hub
    # --cpu: the CPU build and a server that offloads nothing
    cpu = run_setup(recipe_file, port, "--dry-run", "--cpu").stdout
    assert "(CPU:noCUDAneeded)" in "".join(cpu.split()) and " -ngl 0 -ngld 0 " in cpu
    gpu = subprocess.run([sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe_file), "--yes",
                          "--port", str(port), "--dry-run"], capture_output=True, text=True, timeout=300).stdout
    # without --cpu the plan builds for the card, if there is one; a server on a CPU build
    # offloads nothing (the recipe's -ngl 99 would name a card it cannot use)
    if "build llama.cpp for the GPU" in gpu:
        assert " -ngl 99 -ngld 99 " in gpu and "-ngl 0" not in gpu
    else:
        assert " -ngl 0 -ngld 0 " in gpu and "-ngl 99" not in gpu
    # and the real run skips what the dry run said it would
    real = run_setup(recipe_file, port)
    assert real.returncode == 0, real.stderr[-3000:]
    for stage in ("vendor", "patch", "pull", "drafter", "convert"):
        assert skipped(real, stage), (stage, real.stderr[-2000:])
    # the plan's server command is the one that runs (--alias, no secret): serve is skipped now
    after = run_setup(recipe_file, port, "--dry-run")
    assert _plan_rows(after.stdout)["serve"][0] == "skip", after.stdout


def test_the_patch_stage_prints_its_result(fake_project, capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from buun_tool.app import setup
    from buun_tool.pipeline import patches, vendor
    from tests.support.fake_llama_source import commit_change

    vendor.vendor()
    commit_change(fake_project.llama, "common/arg.cpp", "int option_3 = 3;", "int option_3 = 33;", "arg: a change")
    patches.export()
    patches.reverse()
    stage = next(s for s in setup.STAGES if s.name == "patch")
    recipe_file = Path(__file__).resolve().parent.parent / "recipes" / "qwen3.5-27b-dflash.yaml"
    ctx = setup.Context(recipes.load_file(recipe_file), paths.models_dir())  # the checkout's: BUUN_ROOT is the fake one
    capsys.readouterr()
    stage.run(ctx)
    # the count, not the names: buun's 48 made one line of ~3.5 KB; --verbose names them
    err = capsys.readouterr().err
    assert "applied 1 of 1 patch(es) (`buun patch --status` lists them)" in err and "0001-arg" not in err, err
    patches.reverse()
    stage.run(replace(ctx, verbose=True))
    assert "applied 1 of 1 patch(es): 0001-arg-a-change.patch" in capsys.readouterr().err


def test_refuses_without_yes_when_not_interactive(setup_env: tuple[Path, int]) -> None:
    recipe_file, port = setup_env
    cmd = [sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe_file), "--cpu", "--port", str(port)]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert out.returncode == 2 and "--yes" in out.stderr


def _serve_until_ready(recipe_file: Path, name: str, *options: str, env: dict[str, str] | None = None) -> dict:
    """`buun serve RECIPE` in the foreground, with no model path: one completion once it is ready,
    then Ctrl-C. Returns the launch spec it ran."""
    port = free_port()
    offload = ["--", "-ngl", "0", "-ngld", "0"] if CPU else []  # as `buun setup --cpu` serves
    cmd = [sys.executable, "-m", "buun_tool", "serve", str(recipe_file), "--name", name, "--port", str(port),
           *options, *offload]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    inst = Instance(name)
    try:
        deadline = time.monotonic() + 300
        while (r := inst.read()) is None or r.state.value != "ready":
            assert proc.poll() is None, f"buun serve exited {proc.returncode}: {proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "buun serve did not get ready in 300 s"
            time.sleep(0.2)
        reply = requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 4},
                              timeout=60)
        assert reply.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    spec = inst.read_spec()
    assert spec is not None
    return spec


def test_one_models_folder_from_setup_to_serve_and_restart(setup_env: tuple[Path, int], tmp_path: Path) -> None:
    """`buun setup --models-dir X`, then a plain `buun serve --models-dir X` and `buun serve` with
    BUUN_MODELS_DIR=X both serve the models setup made there; `buun restart --models-dir Y` serves
    a copy of them from Y."""
    recipe_file, port = setup_env
    recipe = recipes.load_file(recipe_file)
    models = tmp_path / "elsewhere" / "models"
    first = run_setup(recipe_file, port, "--models-dir", str(models))
    assert first.returncode == 0, first.stderr[-3000:]
    made = layout.for_recipe(recipe, models)
    assert made.target_gguf.is_file() and made.drafter_gguf().is_file()
    assert not paths.models_dir().exists()  # nothing went to the default folder
    _buun("stop", "--all")

    by_option = _serve_until_ready(recipe_file, "by-option", "--models-dir", str(models))
    by_env = _serve_until_ready(recipe_file, "by-env", env={"BUUN_MODELS_DIR": str(models)})
    for spec in (by_option, by_env):
        assert (spec["target"], spec["draft"]) == (str(made.target_gguf), str(made.drafter_gguf()))
        assert spec["models_dir"] == str(models)

    copy = tmp_path / "copy"
    shutil.copytree(models, copy)
    _buun("restart", "by-option", "--models-dir", str(copy))  # a stopped instance, from another folder
    try:
        spec = Instance("by-option").read_spec()
        assert spec is not None and spec["draft"] == str(layout.for_recipe(recipe, copy).drafter_gguf())
        assert control.status(Instance("by-option")).state == "ready"
    finally:
        _buun("stop", "by-option")
