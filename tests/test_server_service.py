"""`buun service install`: the systemd user unit's content (written, not started without --now), the
launch spec it runs, and that spec run as systemd would run it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.cli.app import app
from buun_tool.formats import layout
from buun_tool.server import service
from buun_tool.server.instance import Instance
from buun_tool.server.process import free_port
from tests.support.fixtures_server import TEST_FLAGS, Buun, chat

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def unit_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """An isolated systemd user folder, a fake llama-server, model files, and a record of systemctl use."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").write_text("#!/bin/sh\n")
    monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(bindir))
    models = tmp_path / "my models"
    models.mkdir()
    for f in ("t.gguf", "d.gguf"):
        (models / f).write_bytes(b"GGUF")
    calls: list[str] = []
    monkeypatch.setattr(service, "enable_now", lambda name: calls.append(name))
    return {"models": models, "calls": calls, "dir": tmp_path / "xdg" / "systemd" / "user"}


def install(env: dict, *args: str):
    m = env["models"]
    return CliRunner().invoke(app, ["service", "install", "--model", str(m / "t.gguf"), "--draft", str(m / "d.gguf"),
                                    *args])


def exec_start(unit: str) -> list[str]:
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


def saved(name: str) -> dict:
    """The launch spec the unit of `name` runs."""
    return json.loads(Instance(name).service_spec_file.read_text())


def test_unit_runs_the_launch_saved_at_install(unit_env: dict) -> None:
    r = install(unit_env, "--name", "main", "--port", "9090", "--max-crashes", "7", "--drop", "-cd",
                "--", "-c", "4096", "--spec-type", "draft-dflash")
    assert r.exit_code == 0, r.output
    unit_file = unit_env["dir"] / "buun-main.service"
    unit = unit_file.read_text()
    assert unit_env["calls"] == []  # written, not started
    # no option of buun's command line in the unit: renaming one cannot break it
    assert exec_start(unit) == [sys.executable, "-m", "buun_tool.server.supervisor", "main",
                                "--spec", str(Instance("main").service_spec_file)]
    spec = saved("main")
    m = unit_env["models"]
    assert (spec["name"], spec["port"], spec["target"], spec["draft"]) == ("main", 9090, str(m / "t.gguf"),
                                                                           str(m / "d.gguf"))
    flags = dict(spec["flags"])
    assert flags["-c"] == "4096" and flags["--spec-type"] == "draft-dflash" and "-cd" not in flags
    assert spec["policy"]["max_crashes"] == 7
    for line in ("[Service]", "Type=simple", "KillMode=mixed", "Restart=on-failure",
                 "ExecReload=/bin/kill -HUP $MAINPID", "WantedBy=default.target", f"WorkingDirectory={ROOT}"):
        assert line in unit.splitlines(), line
    assert 'Environment="BUUN_LLAMA_BIN_DIR=' in unit  # the service sees the same binaries and folders
    assert "TimeoutStopSec=30" in unit  # the supervisor's grace (15 s) plus room to exit
    assert "systemctl --user enable --now buun-main.service" in " ".join(r.stderr.split())


def test_the_patch_switches_reach_the_service(unit_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """`LLAMA_RS_ROLLBACK=snapshot buun service install` must serve with snapshots, as `buun serve` would;
    likewise the switch that keeps MMQ for the verify's Q4_K matmuls."""
    monkeypatch.setenv("LLAMA_RS_ROLLBACK", "snapshot")
    monkeypatch.setenv("GGML_CUDA_MMQ_SMALL", "0")
    monkeypatch.delenv("LLAMA_SPEC_PROFILE", raising=False)
    assert install(unit_env, "--name", "s").exit_code == 0
    unit = (unit_env["dir"] / "buun-s.service").read_text()
    assert 'Environment="LLAMA_RS_ROLLBACK=snapshot"' in unit.splitlines()
    assert 'Environment="GGML_CUDA_MMQ_SMALL=0"' in unit.splitlines()
    assert "LLAMA_SPEC_PROFILE" not in unit


def test_a_saved_spec_from_another_buun_is_refused_with_the_fix(unit_env: dict) -> None:
    assert install(unit_env, "--name", "x").exit_code == 0
    path = Instance("x").service_spec_file
    path.write_text(json.dumps({**saved("x"), "renamed_field": 1}))
    r = subprocess.run(exec_start((unit_env["dir"] / "buun-x.service").read_text()), capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 3 and "is not one this buun reads" in r.stdout and "buun service install" in r.stdout


def test_now_starts_it_and_other_settings_need_force(unit_env: dict) -> None:
    assert install(unit_env, "--name", "n", "--now").exit_code == 0
    assert unit_env["calls"] == ["n"]
    r = install(unit_env, "--name", "n", "--port", "1234")
    assert r.exit_code == 1 and "--force" in " ".join(r.stderr.split())
    assert install(unit_env, "--name", "n", "--port", "1234", "--force").exit_code == 0
    assert saved("n")["port"] == 1234


def test_an_api_key_is_never_written(unit_env: dict) -> None:
    r = install(unit_env, "--name", "k", "--", "--api-key", "sekrit")
    assert r.exit_code == 2 and "--api-key-file" in " ".join(r.stderr.split())
    assert not (unit_env["dir"] / "buun-k.service").exists()
    keys = unit_env["models"].parent / "keys"
    keys.write_text("sekrit\n")
    assert install(unit_env, "--name", "k", "--host", "0.0.0.0", "--", "--api-key-file", str(keys)).exit_code == 0
    assert "sekrit" not in (unit_env["dir"] / "buun-k.service").read_text() + json.dumps(saved("k"))


def test_a_key_file_without_a_key_is_refused_and_a_relative_one_is_saved_whole(
        unit_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server skips a key file's empty lines and those starting with '#': a file of only
    those passed the check and the unit served 0.0.0.0 without a key. The unit's llama-server runs
    in buun's folder: a path relative to the install's folder is saved whole."""
    keys = tmp_path / "keys"
    keys.write_text("# the key for the LAN, one a line\n\n")
    monkeypatch.chdir(tmp_path)
    r = install(unit_env, "--name", "f", "--host", "0.0.0.0", "--", "--api-key-file", "keys")
    assert r.exit_code == 2, r.output
    assert f"--api-key-file {keys} holds no key: llama-server skips its empty lines" in " ".join(r.stderr.split())
    assert not (unit_env["dir"] / "buun-f.service").exists()
    keys.write_text("# the key for the LAN, one a line\nsekrit\n")
    assert install(unit_env, "--name", "f", "--host", "0.0.0.0", "--", "--api-key-file", "keys").exit_code == 0
    assert ["--api-key-file", str(keys)] in saved("f")["flags"]


def test_a_hub_token_is_never_written(unit_env: dict) -> None:
    r = install(unit_env, "--name", "k", "--", "-hft", "hf_sekrit")
    assert r.exit_code == 2 and "-hft after `--` cannot reach the unit" in " ".join(r.stderr.split())
    assert not (unit_env["dir"] / "buun-k.service").exists()


def test_an_open_unit_without_key_is_refused_unless_no_api_key(unit_env: dict) -> None:
    r = install(unit_env, "--name", "o", "--host", "0.0.0.0")
    assert r.exit_code == 2 and "--no-api-key" in " ".join(r.stderr.split())
    assert not (unit_env["dir"] / "buun-o.service").exists()
    assert install(unit_env, "--name", "o", "--host", "0.0.0.0", "--no-api-key").exit_code == 0
    assert saved("o")["no_api_key"] is True  # the unit's launch would refuse without it


def test_uninstall(unit_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service.shutil, "which", lambda name: None)  # no systemctl to call
    assert install(unit_env, "--name", "u").exit_code == 0
    r = CliRunner().invoke(app, ["service", "uninstall", "u"])
    assert r.exit_code == 0 and not (unit_env["dir"] / "buun-u.service").exists()
    assert not Instance("u").service_spec_file.exists()
    assert CliRunner().invoke(app, ["service", "uninstall", "u"]).exit_code == 2


@pytest.mark.parametrize("arg,quoted", [("plain", "plain"), ("/a b/c", '"/a b/c"'), ("100%", "100%%"),
                                        ("$HOME", "$$HOME"), ('say "hi"', '"say \\"hi\\""')])
def test_exec_start_quoting(arg: str, quoted: str) -> None:
    assert service.quote(arg) == quoted


def test_the_unit_serves_the_recipe_models_from_the_folder_resolved_at_install(
        unit_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --model/--draft the unit runs the recipe's models from the folder this command
    resolved (option or BUUN_MODELS_DIR), not whatever its environment says later."""
    from buun_tool.formats import recipes
    from buun_tool.pipeline import convert

    models = tmp_path / "models"
    lay = layout.for_recipe(recipes.load(), models)
    for f in (lay.target_gguf, lay.drafter_gguf(), convert.provenance_path(lay.drafter_gguf())):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"GGUF")
    by_option = CliRunner().invoke(app, ["service", "install", "--name", "opt", "--models-dir", str(models)])
    monkeypatch.setenv("BUUN_MODELS_DIR", str(models))
    by_env = CliRunner().invoke(app, ["service", "install", "--name", "env"])
    for name, r in (("opt", by_option), ("env", by_env)):
        assert r.exit_code == 0, r.output
        spec = saved(name)
        assert (spec["models_dir"], spec["target"], spec["draft"]) == (str(models), str(lay.target_gguf),
                                                                       str(lay.drafter_gguf()))


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " ",
              "\\": "\\", '"': '"', "'": "'"}


def _systemd_words(rvalue: str) -> list[str]:
    """A setting's words as systemd.syntax reads them: specifiers expanded (only %% is written by
    buun: any other % is an error here), then split at white space outside quotes, with C escapes
    (\\n, \\xNN, \\\\, \\") unescaped."""
    assert re.fullmatch(r"(?:[^%]|%%)*", rvalue), f"an unescaped specifier in {rvalue!r}"
    text, words, word, quote, i = rvalue.replace("%%", "%"), [], None, None, 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            nxt = text[i + 1]
            if nxt == "x":
                c, i = chr(int(text[i + 2:i + 4], 16)), i + 2
            else:
                c = _C_ESCAPES[nxt]
            i += 1
        elif c in "\"'" and quote in (None, c):
            quote = None if quote else c
            word, i = word or "", i + 1
            continue
        elif c in " \t" and quote is None:
            if word is not None:
                words.append(word)
            word, i = None, i + 1
            continue
        word, i = (word or "") + c, i + 1
    assert quote is None, f"an unclosed quote in {rvalue!r}"
    return [*words, *([word] if word is not None else [])]


def _unit_env(unit: str) -> dict[str, str]:
    """The unit's Environment= assignments as systemd reads them (its lines end at \\n alone)."""
    out = {}
    for line in unit.split("\n"):
        if line.startswith("Environment="):
            for word in _systemd_words(line[len("Environment="):]):
                key, value = word.split("=", 1)
                out[key] = value
    return out


def test_environment_values_are_written_as_systemd_reads_them(unit_env: dict,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A carried value is read back as it was: a newline in it ended its Environment= line, and the
    rest became a directive of its own (here an ExecStartPre)."""
    tricky = 'a\nExecStartPre=/bin/false\n "q" \\ \\n 100% $HOME ${X}\tend\x01\\'
    monkeypatch.setenv("LLAMA_SPEC_PROFILE", tricky)
    assert install(unit_env, "--name", "e").exit_code == 0
    unit = (unit_env["dir"] / "buun-e.service").read_text()
    directives = [ln.split("=", 1)[0] for ln in unit.split("\n") if ln and not ln.startswith(("#", "["))]
    assert "ExecStartPre" not in directives and directives.count("ExecStart") == 1
    assert _unit_env(unit)["LLAMA_SPEC_PROFILE"] == tricky


def test_a_folder_a_unit_cannot_name_is_refused(tmp_path: Path) -> None:
    """WorkingDirectory= has no quoting: buun run from a folder with a newline in its name refuses
    to write the unit rather than write a second directive."""
    root = tmp_path / "src\nExecStartPre=x"
    shutil.copytree(ROOT / "buun_tool", root / "buun_tool", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("from pathlib import Path; from buun_tool.server import service\n"
            "from buun_tool.base.errors import BuunError\n"
            "try: service.render('x', Path('/s'), 10, {})\n"
            "except BuunError as e: print(e.message)")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert "which a systemd unit's WorkingDirectory= cannot hold" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_the_unit_runs_its_launch_as_systemd_would(buun: Buun, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit's ExecStart, with its environment and folder, serves the saved launch; SIGTERM (what
    KillMode=mixed sends the supervisor on `systemctl stop`) stops it, leaving nothing behind."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    port = free_port()
    buun("service", "install", *buun.launch_args("svc", port, extra=TEST_FLAGS), check=True)
    unit = (tmp_path / "xdg" / "systemd" / "user" / "buun-svc.service").read_text()
    proc = subprocess.Popen(exec_start(unit), env={**os.environ, **_unit_env(unit)}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        buun.wait_state("svc", lambda r: r["state"] == "ready")
        assert chat(port).status_code == 200
        assert Instance("svc").read_spec()["port"] == port  # the running launch, as `buun status` reads it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stdout.read() if proc.stdout else ""
    finally:
        proc.kill()
        proc.wait()
    assert buun.record("svc")["state"] == "stopped" and not buun.ours()


@pytest.mark.parametrize("option, good, flags, bad, refusal", [
    ("--tree-budget", "22", {"--spec-tree-budget": "22", "--spec-tree-k": "8"}, "99", "more than -ub 64"),
    ("--slots", "4", {"-np": "4"}, "12", "12 slots: buun serves 1 to 8"),
])
def test_the_tree_budget_and_the_slots_reach_the_unit(unit_env: dict, option: str, good: str, flags: dict[str, str],
                                                      bad: str, refusal: str) -> None:
    """--tree-budget and --slots are resolved into the launch the unit runs, not written into ExecStart."""
    assert install(unit_env, "--name", "t", option, good).exit_code == 0
    saved_flags = dict(saved("t")["flags"])
    assert {k: saved_flags[k] for k in flags} == flags
    assert option not in exec_start((unit_env["dir"] / "buun-t.service").read_text())
    r = install(unit_env, "--name", "u", option, bad)  # refused before a unit is written
    assert r.exit_code == 2 and refusal in " ".join(r.stderr.split())
    assert not (unit_env["dir"] / "buun-u.service").exists()


def test_a_recipes_api_key_is_refused_not_dropped(unit_env: dict, tmp_path: Path) -> None:
    """A recipe's `--api-key` cannot reach the unit either: the install was accepted (the key
    passed the exposure check) and the unit then served without it, or failed at every start."""
    import yaml

    from buun_tool.formats import recipes
    data = yaml.safe_load(recipes.load().source.read_text())
    data["server"]["flags"]["--api-key"] = "sekrit"
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(yaml.safe_dump(data, sort_keys=False))
    for host in ("0.0.0.0", "127.0.0.1"):
        r = install(unit_env, str(keyed), "--name", "k", "--host", host)
        assert r.exit_code == 2, r.output
        assert "--api-key-file" in " ".join(r.stderr.split()) and "sekrit" not in r.output
        assert not (unit_env["dir"] / "buun-k.service").exists() and not Instance("k").service_spec_file.exists()
    assert install(unit_env, str(keyed), "--name", "k", "--drop", "--api-key").exit_code == 0  # the hint's way out
