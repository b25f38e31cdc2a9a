"""The llama-server command line: flag parsing, recipe overrides by any spelling, drops,
managed and secret flags, and `buun serve --print-cmd` through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from buun_tool.base import cmdline, command, paths
from buun_tool.base.command import canonical, merge, parse_args, recipe_flags
from buun_tool.base.errors import NotReadyError, UsageError
from buun_tool.cli.app import app
from buun_tool.formats import layout, recipes
from buun_tool.server import settings, spec


class TestCanonical:
    @pytest.mark.parametrize("spelling,expected", [
        ("-c", "-c"), ("--ctx-size", "-c"), ("--ctx_size", "-c"),
        ("-ngl", "-ngl"), ("--n-gpu-layers", "-ngl"), ("--gpu-layers", "-ngl"),
        ("--draft-max", "--draft-max"), ("--spec-draft-n-max", "--draft-max"),
        ("--spec-draft-n-min", "--draft-min"), ("--spec-draft-ngl", "-ngld"),
        ("--no-jinja", "--jinja"), ("--no-webui", "--ui"), ("-nkvo", "-kvo"),
        ("--backend-sampling", "-bs"),
        ("--tree-budget", "--spec-tree-budget"), ("--ddtree-budget", "--spec-tree-budget"),
        ("--some-new-flag", "--some-new-flag"),
    ])
    def test_spellings(self, spelling: str, expected: str) -> None:
        assert canonical(spelling) == expected


def test_an_option_is_found_in_any_spelling() -> None:
    """What `buun fit` reads from the recipe's flags, through the one table of spellings."""
    flags = {"--ctx-size": "4096", "--spec-draft-n-max": "8", "--no-kv-offload": True, "-kvo": True}
    assert command.option(flags, "-c") == "4096" and command.option(flags, "--draft-max") == "8"
    assert command.option(flags, "-cd", "none") == "none"
    assert command.option(flags, "--kv-offload") is True  # -kvo, not its negation
    assert command.option({"-c": "1", "--ctx-size": "2"}, "-c") == "2"  # the last one given wins


class TestParseArgs:
    def test_values_switches_and_equals(self) -> None:
        assert parse_args(["-c", "4096", "--jinja", "--spec-type=draft-dflash", "--seed", "-1", "-fa", "on"]) == [
            ("-c", "4096"), ("--jinja", None), ("--spec-type", "draft-dflash"), ("--seed", "-1"), ("-fa", "on")]

    def test_trailing_switch(self) -> None:
        assert parse_args(["-ngl", "10", "--no-mmap"]) == [("-ngl", "10"), ("--no-mmap", None)]

    def test_stray_value_is_refused(self) -> None:
        with pytest.raises(UsageError, match="unexpected argument '4096'"):
            parse_args(["4096"])


RECIPE = {"--spec-type": "dflash", "-ngl": 99, "-c": 6048, "-cd": 256, "-fa": "on", "--draft-max": 16,
          "--draft-min": 1, "--jinja": True, "--mlock": False}


class TestMerge:
    def test_recipe_flags_keep_order_true_is_switch_false_is_left_out(self) -> None:
        assert recipe_flags(RECIPE) == [
            ("--spec-type", "dflash"), ("-ngl", "99"), ("-c", "6048"), ("-cd", "256"), ("-fa", "on"),
            ("--draft-max", "16"), ("--draft-min", "1"), ("--jinja", None)]

    def test_override_by_other_spelling_takes_the_recipe_place(self) -> None:
        out = merge(recipe_flags(RECIPE), parse_args(["--ctx-size", "4096", "--n-gpu-layers", "20"]))
        assert out[1:3] == [("--n-gpu-layers", "20"), ("--ctx-size", "4096")]
        assert ("-c", "6048") not in out and ("-ngl", "99") not in out

    def test_upstream_names_replace_the_fork_names(self) -> None:
        out = merge(recipe_flags(RECIPE), parse_args(["--spec-draft-n-max", "8", "--spec-type", "draft-dflash"]))
        assert ("--spec-draft-n-max", "8") in out and ("--spec-type", "draft-dflash") in out
        assert ("--draft-max", "16") not in out and ("--spec-type", "dflash") not in out

    def test_negation_replaces_the_switch(self) -> None:
        out = merge(recipe_flags(RECIPE), parse_args(["--no-jinja"]))
        assert ("--jinja", None) not in out and out[-1] == ("--no-jinja", None)

    def test_drop_and_new_flags(self) -> None:
        out = merge(recipe_flags(RECIPE), parse_args(["-ctk", "q8_0", "-ctv", "q8_0"]), drops=["--ctx-size-draft"])
        assert all(name != "-cd" for name, _ in out)
        assert out[-2:] == [("-ctk", "q8_0"), ("-ctv", "q8_0")]

    def test_repeated_override_flags_all_pass(self) -> None:
        out = merge([], parse_args(["-ot", "a=CPU", "-ot", "b=CPU"]))
        assert out == [("-ot", "a=CPU"), ("-ot", "b=CPU")]


class TestManagedAndSecrets:
    def test_managed_flags_are_refused_with_the_buun_option(self) -> None:
        with pytest.raises(UsageError) as exc:
            command.check_unmanaged(parse_args(["--model", "x.gguf"]), "the arguments after `--`")
        assert "--model" in str(exc.value.hint)
        with pytest.raises(UsageError, match="--port"):
            command.check_unmanaged([("--port", "1")], "x")

    def test_metrics_cannot_be_dropped(self) -> None:
        with pytest.raises(UsageError, match="always"):
            command.check_drops(["--metrics"])

    def test_api_key_leaves_the_argv(self) -> None:
        flags, secrets = command.take_secrets(parse_args(["--api-key", "s3cret", "-c", "1", "--hf-token", "hf_x"]))
        assert secrets == {"--api-key": "s3cret", "-hft": "hf_x"} and flags == [("-c", "1")]
        key = secrets["--api-key"]
        argv = command.server_argv("/bin/llama-server", "t.gguf", "d.gguf", "127.0.0.1", 8080, flags)
        assert "s3cret" not in argv
        assert argv[:5] == ["/bin/llama-server", "-m", "t.gguf", "-md", "d.gguf"]
        assert argv[-5:] == ["--host", "127.0.0.1", "--port", "8080", "--metrics"]
        assert command.display(argv, key).startswith("LLAMA_API_KEY=**** ")

    def test_the_model_is_named_by_the_recipe_unless_the_user_names_it(self) -> None:
        argv = command.server_argv("s", "/m/t.gguf", "/m/d.gguf", "127.0.0.1", 1, [("-c", "1")], alias="r")
        assert argv[argv.index("--alias") + 1] == "r"
        argv = command.server_argv("s", "/m/t.gguf", "/m/d.gguf", "127.0.0.1", 1, [("-a", "mine")], alias="r")
        assert "--alias" not in argv and argv[argv.index("-a") + 1] == "mine"

    def test_no_drafter_no_md(self) -> None:
        """An AR server (bench's baseline, fit's AR measurement) from the same builder."""
        argv = command.server_argv("s", "t.gguf", None, "127.0.0.1", 1, [("-c", "1")])
        assert argv[:4] == ["s", "-m", "t.gguf", "-c"] and "-md" not in argv

    def test_models_taken_from_raw_arguments(self) -> None:
        target, draft, rest = command.take_models(parse_args(["--model", "t.gguf", "-c", "1", "-md", "d.gguf"]))
        assert (target, draft, rest) == ("t.gguf", "d.gguf", [("-c", "1")])
        assert command.take_models(parse_args(["-m", "t.gguf"]))[1] is None
        with pytest.raises(UsageError, match="no model"):
            command.take_models(parse_args(["-c", "1"]))

    def test_mask(self) -> None:
        assert command.mask(["x", "--api-key", "k", "-hft", "t", "-c", "1"]) == [
            "x", "--api-key", "****", "-hft", "****", "-c", "1"]

    def test_child_env_carries_the_key_only_as_llama_api_key(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("BUUN_API_KEY", "k1")
        monkeypatch.setenv("LLAMA_API_KEY", "stale")
        env = settings.child_env("k2")
        assert env["LLAMA_API_KEY"] == "k2" and "BUUN_API_KEY" not in env
        assert "LLAMA_API_KEY" not in settings.child_env(None)

    def test_secret_values_on_our_own_command_line_are_found_in_any_spelling(self) -> None:
        args = [b"buun", b"serve", b"--api-key", b"k1", b"--", b"-c", b"8", b"--api_key=k2", b"-hft", b"t",
                b"--api-key-file", b"/f", b"--hf-token"]
        assert cmdline.secret_spans(args) == [(3, 0, 2), (7, 10, 12), (9, 0, 1)]

    @pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="Linux /proc")
    def test_an_api_key_on_buuns_command_line_is_masked_for_ps(self) -> None:
        """`buun serve --api-key KEY` runs as long as its server: every user of the machine reads
        its arguments (/proc/PID/cmdline). buun masks the key there on start, as `****` whatever its
        length (a `*` a byte told it); the CLI still reads it."""
        stand_in = ("import sys, time, buun_tool.cli.app as a\n"
                    "a.main = lambda: (print(sys.argv, flush=True), time.sleep(30))\n"
                    "from buun_tool.__main__ import main\nmain()\n")
        seen = []
        for size in (5, 40):
            key, token = "k" * size, "hf_" + os.urandom(size).hex()
            argv = [sys.executable, "-c", stand_in, "serve", "--api-key", key, "--", f"--hf-token={token}", "-c", "8"]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
            try:
                assert proc.stdout is not None
                seen_by_buun = proc.stdout.readline()
                seen_by_others = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                split_by_ps = psutil.Process(proc.pid).cmdline()
            finally:
                proc.kill()
                proc.wait()
            assert key in seen_by_buun and token in seen_by_buun
            assert key.encode() not in seen_by_others and token.encode() not in seen_by_others
            assert seen_by_others.endswith(b" serve --api-key **** -- --hf-token=**** -c 8\0")
            assert split_by_ps[-6:] == ["--api-key", "****", "--", "--hf-token=****", "-c", "8"]
            seen.append(seen_by_others)
        assert seen[0] == seen[1]  # nothing tells a 5-byte key from a 40-byte one

    def test_a_masked_command_line_keeps_its_size_and_ends_as_a_title(self) -> None:
        raw = b"buun\0serve\0--api-key\0abcde\0"
        title = cmdline.masked_title(raw)
        assert title == b"buun serve --api-key ****\0*" and len(title) == len(raw)
        assert cmdline.masked_title(b"buun\0serve\0-c\0008\0") is None  # nothing secret: left as it is
        short = b"buun\0--api-key\0ab\0"  # the line is longer than the memory: it loses its end
        assert cmdline.masked_title(short) == b"buun --api-key *\0*"

    @pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                           ("/tmp/s.sock", True), ("0.0.0.0", False), ("192.168.1.2", False)])
    def test_loopback(self, host: str, loop: bool) -> None:
        assert command.is_loopback(host) is loop

    def test_probe_address_of_a_wildcard_bind(self) -> None:
        assert command.base_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
        assert command.base_url("::", 9) == "http://[::1]:9"


class TestPolicy:
    def test_backoff_doubles_up_to_the_cap(self) -> None:
        p = spec.Policy(backoff_initial=1, backoff_max=5)
        assert [p.backoff(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]

    def test_bad_values(self) -> None:
        with pytest.raises(UsageError):
            spec.Policy(max_crashes=0).validate()
        with pytest.raises(UsageError):
            spec.Policy(backoff_initial=-1).validate()


def test_default_models_says_what_to_run() -> None:
    from buun_tool.formats import recipes

    recipe = recipes.load()
    with pytest.raises(NotReadyError) as exc:
        spec.default_models(recipe, paths.models_dir())
    assert "buun pull" in str(exc.value.hint)
    target = layout.for_recipe(recipe, paths.models_dir()).target_gguf  # pulled, but the drafter not converted yet
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF")
    with pytest.raises(NotReadyError) as exc:
        spec.default_models(recipe, paths.models_dir())
    assert "buun convert" in str(exc.value.hint)


# the target and drafter given by path (--model, --draft): no models folder is read
_GIVEN = {"models_dir": Path("/m"), "model": Path("/m/t.gguf"), "draft": Path("/m/d.gguf")}


# --- through the CLI ------------------------------------------------------------------------

def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


class TestPrintCmd:
    def run(self, *args: str):
        return CliRunner().invoke(app, ["serve", "--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--print-cmd", *args])

    def test_recipe_flags_unchanged_plus_what_buun_adds(self, fake_bin: Path) -> None:
        r = self.run()
        assert r.exit_code == 0, r.output
        assert r.stdout.strip() == (
            f"{fake_bin}/llama-server -m /m/t.gguf -md /m/d.gguf --spec-type dflash -ngl 99 -ngld 99 "
            "-c 6048 -cd 256 -fa on -b 256 -ub 64 --draft-max 16 --draft-min 1 --spec-verify-max 64 "
            "--spec-skip-after 3 --jinja --backend-sampling "
            "-np 1 --alias qwen3.5-27b-dflash --host 127.0.0.1 --port 8080 --metrics")  # -np: server.slots

    def test_a_context_without_its_number(self, fake_bin: Path) -> None:
        r = self.run("--", "-c")  # before: "-c True: expected a number of tokens"
        assert r.exit_code == 2 and "-c without a value: expected a number of tokens" in flat(r.stderr), r.output
        assert "True" not in r.stderr

    def test_backend_sampling_dropped_in_either_spelling(self, fake_bin: Path) -> None:
        for spelling in ("--backend-sampling", "-bs"):
            r = self.run("--drop", spelling)
            assert r.exit_code == 0, r.output
            assert "--backend-sampling" not in r.stdout and " -bs" not in r.stdout and "--jinja" in r.stdout

    def test_overrides_drops_and_a_masked_key(self, fake_bin: Path) -> None:
        r = self.run("--drop", "-cd", "--port", "9001", "--api-key", "hunter2", "--", "--ctx-size", "4096",
                     "--spec-draft-n-max", "8", "-ctk", "q8_0")
        assert r.exit_code == 0, r.output
        out = r.stdout
        assert "hunter2" not in r.output and out.startswith("LLAMA_API_KEY=**** ")
        assert " -cd " not in out and " -c 6048" not in out and "--draft-max" not in out
        assert "--ctx-size 4096" in out and "--spec-draft-n-max 8" in out and out.rstrip().endswith(
            "-ctk q8_0 -np 1 --alias qwen3.5-27b-dflash --host 127.0.0.1 --port 9001 --metrics")


    def test_a_short_secret_flag_with_its_value_after_an_equals_sign_is_masked(self, fake_bin: Path) -> None:
        """`-hft=TOKEN` was one flag of that name, not a secret one: shown, saved in the spec and put
        on llama-server's command line as it was."""
        r = self.run("--", "-hft=hf_sekrit", "-c=4096")
        assert r.exit_code == 0, r.output
        assert "sekrit" not in r.output and " -c 4096 " in r.stdout
        assert cmdline.secret_spans([b"buun", b"serve", b"--", b"-hft=hf_t"]) == [(3, 5, 9)]

    def test_supervision_values_are_checked_by_their_option_names(self, fake_bin: Path) -> None:
        """nan passed the check, inf or nan MiB of log was a traceback (OverflowError, ValueError),
        and a negative --backoff or --log-max-mb was named by the spec's field (--backoff-initial,
        --log-max-bytes), an option no command has."""
        for option, value in (("--log-max-mb", "inf"), ("--log-max-mb", "nan"), ("--log-max-mb", "-1"),
                              ("--backoff", "-1"), ("--ready-timeout", "nan"), ("--health-interval", "-inf")):
            r = self.run(option, value)
            assert r.exit_code == 2, (option, value, r.output)
            assert r.stderr.startswith(f"error: {option} {value}: expected a finite number of 0 or more\n"), r.output

    def test_managed_flag_after_dashes(self, fake_bin: Path) -> None:
        r = self.run("--", "-m", "other.gguf")
        assert r.exit_code == 2 and "buun serve --model" in flat(r.stderr)

    def test_a_misspelt_rollback_switch_is_refused(self, fake_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """llama-server would run the tape replay for any value but `snapshot`, without a word."""
        monkeypatch.setenv("LLAMA_RS_ROLLBACK", "snapshot")
        assert self.run().exit_code == 0
        monkeypatch.setenv("LLAMA_RS_ROLLBACK", "upstream")
        r = self.run()
        assert r.exit_code == 2 and "LLAMA_RS_ROLLBACK=upstream: expected tape or snapshot" in flat(r.stderr)

    def test_missing_models_point_to_pull(self, fake_bin: Path) -> None:
        r = CliRunner().invoke(app, ["serve"])
        assert r.exit_code == 3 and "buun pull" in flat(r.stderr)

    def test_print_cmd_before_the_models_are_made(self, fake_bin: Path) -> None:
        """The command with the paths the models will have, and a word that they are not there yet."""
        from buun_tool.formats import recipes

        target, draft = spec.default_paths(recipes.load(), paths.models_dir())
        r = CliRunner().invoke(app, ["serve", "--print-cmd"])
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(f"{fake_bin}/llama-server -m {target} -md {draft} --spec-type dflash ")
        err = flat(r.stderr)
        assert f"warning: the target model {target} does not exist; run `buun pull qwen3.5-27b-dflash`" in err
        assert f"warning: the drafter {draft} does not exist; run `buun convert qwen3.5-27b-dflash`" in err

    def test_print_cmd_before_the_build(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The README offers `buun serve --print-cmd` to see the command early: before the build it
        refused (exit 3, "llama.cpp is not built yet"). It prints the command with the path the
        build will make (a CPU build where no card and no nvcc are found: -ngl 0) and says on stderr
        that it is not built yet."""
        monkeypatch.delenv("BUUN_LLAMA_BIN_DIR", raising=False)
        monkeypatch.setenv("BUUN_BUILD_DIR", str(tmp_path / "build"))
        monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no nvidia-smi, no nvcc
        binary = tmp_path / "build" / "cpu" / "bin" / "llama-server"
        r = CliRunner().invoke(app, ["serve", "--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--print-cmd"])
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(f"{binary} -m /m/t.gguf -md /m/d.gguf ") and " -ngl 0 " in r.stdout, r.stdout
        assert f"warning: llama-server is not built yet: {binary} does not exist; run `buun build`" in flat(r.stderr)
        assert CliRunner().invoke(app, ["serve", "--model", "/m/t.gguf", "--draft", "/m/d.gguf"]).exit_code == 3

    def test_hints_name_a_recipe_file_by_the_path_given(self, fake_bin: Path, tmp_path: Path) -> None:
        """A recipe given as a file: the hints said `buun pull NAME` with the name inside the file,
        which `buun pull` does not know, or knows as another recipe (this copy keeps the shipped
        one's name). They name the path the user gave; a shipped recipe is named by its name."""
        from buun_tool.formats import recipes

        own = tmp_path / "my recipe.yaml"
        own.write_text(recipes.load().source.read_text())
        quoted = f"'{own}'"
        r = CliRunner().invoke(app, ["serve", "--print-cmd", str(own)])
        assert r.exit_code == 0, r.output
        assert f"does not exist; run `buun pull {quoted}` (or `buun setup`)" in flat(r.stderr), r.stderr
        assert f"run `buun convert {quoted}`" in flat(r.stderr) and "qwen3.5-27b-dflash`" not in r.stderr
        r = CliRunner().invoke(app, ["start", str(own)])
        assert r.exit_code == 3 and f"run `buun pull {quoted}` into this folder" in flat(r.stderr), r.output
        shipped = recipes.load().source
        assert recipes.load(str(shipped)).ref == "qwen3.5-27b-dflash"  # its own file, by its path: its name

    def test_a_folder_given_for_a_model_is_named_as_a_folder(self, fake_bin: Path, tmp_path: Path) -> None:
        """`--model DIR` said "the target model DIR does not exist" (and exit 3, as for a model not
        pulled yet): the folder is there, the option names the wrong thing."""
        folder = tmp_path / "models"
        folder.mkdir()
        for name in ("t.gguf", "d.gguf"):
            (tmp_path / name).write_bytes(b"GGUF")
        for option, role in (("--model", "target model"), ("--draft", "drafter")):
            given = ["--model", str(tmp_path / "t.gguf"), "--draft", str(tmp_path / "d.gguf")]
            given[given.index(option) + 1] = str(folder)
            r = CliRunner().invoke(app, ["serve", *given])
            assert r.exit_code == 2, r.output
            assert flat(r.stderr).startswith(f"error: the {role} {folder} is a folder, not a GGUF file hint: pass "
                                             f"{option} with the path of a .gguf file in it"), r.output
            shown = CliRunner().invoke(app, ["serve", *given, "--print-cmd"])
            assert shown.exit_code == 0 and f"the {role} {folder} is a folder" in flat(shown.stderr)

    def test_a_device_or_a_pipe_given_for_a_model_is_named(self, fake_bin: Path, tmp_path: Path) -> None:
        """`--model /dev/null` or a FIFO said "does not exist" (exit 3, run `buun pull`): it is there,
        and llama-server's open of a FIFO waits for a writer forever. The check is `buun gguf`'s."""
        fifo = tmp_path / "pipe.gguf"
        os.mkfifo(fifo)
        (tmp_path / "d.gguf").write_bytes(b"GGUF")
        for path in (Path("/dev/null"), fifo):
            r = CliRunner().invoke(app, ["serve", "--model", str(path), "--draft", str(tmp_path / "d.gguf")])
            assert r.exit_code == 2, r.output
            assert flat(r.stderr).startswith(f"error: the target model {path} is a device or a pipe, not a GGUF file "
                                             "hint: pass --model with the path of a .gguf file"), r.output

    def test_missing_binary_points_to_build(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(tmp_path))
        r = self.run()  # the command with the pinned folder's path, and a word that it is not there
        assert r.exit_code == 0 and r.stdout.startswith(f"{tmp_path}/llama-server "), r.output
        assert f"llama-server is not built yet: {tmp_path}/llama-server does not exist; run `buun build`" \
            in flat(r.stderr)
        r = CliRunner().invoke(app, ["serve", "--model", "/m/t.gguf", "--draft", "/m/d.gguf"])
        assert r.exit_code == 3 and "buun build" in flat(r.stderr)


def test_spec_round_trips_through_json(fake_bin: Path) -> None:
    s, key = spec.resolve(None, **_GIVEN, extra=["--api-key", "zz-secret-zz", "-c", "9"])
    assert key == "zz-secret-zz"
    saved = json.dumps(s.to_json())
    assert "zz-secret-zz" not in saved
    assert spec.LaunchSpec.from_json(json.loads(saved)) == s


def test_error_hints_know_which_recipe_flags_the_user_replaced(fake_bin: Path) -> None:
    s, _ = spec.resolve(None, **_GIVEN, extra=["--ctx-size", "1"])
    assert "-c" not in s.recipe_flags and "-cd" in s.recipe_flags and "--jinja" in s.recipe_flags


# --- secrets and exposure -------------------------------------------------------------------

def _user_recipe(name: str, flags: dict[str, object], tree: dict[str, int] | None = None, slots: int | None = None,
                 **top: object) -> Path:
    """The shipped recipe under another name in the user's recipe folder, with extra server flags
    (and server.tree and server.slots settings)."""
    import yaml

    from buun_tool.formats import recipes

    data = yaml.safe_load(recipes.load().source.read_text())
    data.update(name=name, **top)
    data["server"]["flags"].update(flags)
    data["server"]["tree"].update(tree or {})
    if slots is not None:
        data["server"]["slots"] = slots
    path = paths.config_dir() / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class TestRecipeSecrets:
    KEY, TOKEN = "zz-recipe-key-zz", "hf_zzrecipetokenzz"

    def test_secret_flags_of_a_recipe_go_to_the_environment(self, fake_bin: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
        """A recipe's --api-key and --hf-token take the command line's way: out of argv and spec.json,
        the key to LLAMA_API_KEY and the token to HF_TOKEN (llama-server's own variables)."""
        monkeypatch.setenv("HF_TOKEN", "before")  # restored after the test
        _user_recipe("keyed", {"--api-key": self.KEY, "--hf-token": self.TOKEN})
        s, key = spec.resolve("keyed", **_GIVEN)
        assert key == self.KEY
        for text in (" ".join(s.argv), json.dumps(s.to_json())):
            assert self.KEY not in text and self.TOKEN not in text
        assert "--api-key" not in s.argv and "--hf-token" not in s.argv
        env = settings.child_env(key)
        assert env["LLAMA_API_KEY"] == self.KEY and env["HF_TOKEN"] == self.TOKEN

    def test_command_line_key_replaces_the_recipe_key(self, fake_bin: Path) -> None:
        _user_recipe("keyed", {"--api-key": self.KEY})
        _, key = spec.resolve("keyed", **_GIVEN, extra=["--api-key", "other"])
        assert key == "other"

    def test_print_cmd_masks_a_recipe_key(self, fake_bin: Path) -> None:
        _user_recipe("keyed", {"--api-key": self.KEY})
        r = CliRunner().invoke(app, ["serve", "keyed", "--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--print-cmd"])
        assert r.exit_code == 0, r.output
        assert self.KEY not in r.output and r.stdout.startswith("LLAMA_API_KEY=**** ") and "--api-key" not in r.stdout


class TestExposure:
    """Beyond loopback without an API key is refused unless --no-api-key says it is meant."""

    ARGS = ["--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--host", "0.0.0.0", "--port", "1"]

    @pytest.mark.parametrize("cmd", ["serve", "start"])
    def test_open_bind_without_key_is_refused(self, fake_bin: Path, cmd: str) -> None:
        r = CliRunner().invoke(app, [cmd, *self.ARGS])
        assert r.exit_code == 2, r.output
        text = flat(r.stderr)
        assert "--host 0.0.0.0 lets other machines reach this server and no API key is set" in text
        assert "--api-key" in text and "--no-api-key" in text

    @pytest.mark.parametrize("cmd", ["serve", "start"])
    @pytest.mark.parametrize("opt", [["--no-api-key"], ["--api-key", "k"], ["--", "--api-key-file", "keys"]])
    def test_a_key_or_no_api_key_lets_it_through(self, fake_bin: Path, cmd: str, opt: list[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "keys").write_text("k\n")
        monkeypatch.chdir(tmp_path)
        r = CliRunner().invoke(app, [cmd, *self.ARGS, *opt])
        assert r.exit_code == 3 and "/m/t.gguf does not exist" in flat(r.stderr)  # next check: the models

    # llama-server splits LLAMA_API_KEY at commas ('"' quotes one) and drops the empty parts: each of
    # these was "a key is set" to buun and no key at all to llama-server, which served 0.0.0.0 open
    @pytest.mark.parametrize("key", [",", ",,,", '""', '"",""', '"'])
    @pytest.mark.parametrize("cmd", ["serve", "start"])
    def test_a_key_llama_server_reads_as_none_is_refused(self, fake_bin: Path, cmd: str, key: str) -> None:
        r = CliRunner().invoke(app, [cmd, *self.ARGS, "--api-key", key])
        assert r.exit_code == 2, r.output
        assert ("error: the API key given (--api-key, BUUN_API_KEY, or --api-key in the recipe or after `--`) "
                "holds no key: llama-server splits it at commas") in flat(r.stderr)
        assert "hint: use a key of letters, digits" in flat(r.stderr)

    @pytest.mark.parametrize(("key", "why"), [
        (" ", "no client can send it: it is only white space"),
        ("\t \t", "no client can send it: it is only white space"),
        ("good,  ", "no client can send its part 2 of 2 (split at commas): it is only white space"),
        ("sekrit ", "no client can send it: it ends in white space, which HTTP drops from a header"),
        ("sek\x01rit", "no client can send it: it holds a control character"),
    ])
    def test_a_key_no_client_can_send_is_refused_on_any_host(self, fake_bin: Path, key: str, why: str) -> None:
        """A request's header loses its end spaces: such a server would answer every request 401."""
        for host in ("0.0.0.0", "127.0.0.1"):
            r = CliRunner().invoke(app, ["serve", *self.ARGS[:4], "--host", host, "--port", "1", "--api-key", key])
            assert r.exit_code == 2, r.output
            assert why in flat(r.stderr) and "sekrit" not in r.output

    @pytest.mark.parametrize(("text", "why"), [
        ("", " holds no key: llama-server skips its empty lines and those starting with '#'"),
        ("# the LAN's key, one a line\n\n#sekrit\n", " holds no key: llama-server skips its empty lines"),
        ("# keys\r\nsekrit\r\n", ": no client can send the key of line 2: it holds a control character "
                                   "(a Windows line end?)"),
        ("sekrit\n  \n", ": no client can send the key of line 2: it is only white space"),
    ])
    def test_a_key_file_llama_server_reads_no_usable_key_from_is_refused(self, fake_bin: Path, tmp_path: Path,
                                                                           text: str, why: str) -> None:
        keys = tmp_path / "keys"
        keys.write_bytes(text.encode())
        r = CliRunner().invoke(app, ["start", *self.ARGS, "--", "--api-key-file", str(keys)])
        assert r.exit_code == 2, r.output
        assert f"error: --api-key-file {keys}{why}" in flat(r.stderr)
        assert "sekrit" not in r.output

    def test_a_key_file_that_cannot_be_read_is_refused(self, fake_bin: Path, tmp_path: Path) -> None:
        none = tmp_path / "none"
        r = CliRunner().invoke(app, ["start", *self.ARGS, "--", "--api-key-file", str(none)])
        assert r.exit_code == 2 and f"--api-key-file {none}: cannot read it: No such file" in flat(r.stderr)

    def test_setup_and_a_recipe_key_are_judged_alike(self, fake_bin: Path) -> None:
        r = CliRunner().invoke(app, ["setup", "--host", "0.0.0.0", "--dry-run", "--", "--api-key", ","])
        assert r.exit_code == 2 and "holds no key: llama-server splits it at commas" in flat(r.stderr), r.output
        _user_recipe("keyed", {"--api-key": ",,"})
        r = CliRunner().invoke(app, ["serve", "keyed", *self.ARGS])
        assert r.exit_code == 2 and "holds no key: llama-server splits it at commas" in flat(r.stderr), r.output

    def test_keys_are_split_as_llama_server_splits_them(self) -> None:
        assert command.csv_keys('a,"b,c",,"d""e",f"g') == ["a", "b,c", 'd"e', 'f"g']
        assert command.csv_keys('"x"y') == ["xy"]  # as common/arg.cpp's parse_csv_row: the quotes go

    def test_a_recipe_key_counts(self, fake_bin: Path) -> None:
        _user_recipe("keyed", {"--api-key": "k"})
        r = CliRunner().invoke(app, ["serve", "keyed", *self.ARGS])
        assert r.exit_code == 3 and "/m/t.gguf does not exist" in flat(r.stderr)

    def test_no_api_key_with_a_key_is_a_contradiction(self, fake_bin: Path) -> None:
        r = CliRunner().invoke(app, ["serve", *self.ARGS, "--no-api-key", "--api-key", "k"])
        assert r.exit_code == 2 and "--no-api-key contradicts" in flat(r.stderr)

    def test_setup_refuses_before_its_first_stage(self) -> None:
        r = CliRunner().invoke(app, ["setup", "--host", "0.0.0.0", "--dry-run"])
        assert r.exit_code == 2 and "--no-api-key" in flat(r.stderr) and r.stdout == ""
        r = CliRunner().invoke(app, ["setup", "--host", "0.0.0.0", "--dry-run", "--no-api-key"])
        assert "no API key is set" not in flat(r.stderr) and "server command" in r.stdout

    def test_setup_refuses_a_port_before_its_first_stage(self) -> None:
        """The plan showed `--port 99999` and a real run would have downloaded and built everything
        before the serve stage refused it."""
        for port in ("0", "65536", "99999"):
            r = CliRunner().invoke(app, ["setup", "--port", port, "--dry-run"])
            assert r.exit_code == 2 and r.stderr == f"error: --port {port}: expected 1..65535\n", r.output
            assert r.stdout == ""

    def test_loopback_needs_no_key(self, fake_bin: Path) -> None:
        r = CliRunner().invoke(app, ["serve", *self.ARGS[:4], "--port", "1"])
        assert r.exit_code == 3 and "/m/t.gguf does not exist" in flat(r.stderr)

    def test_restart_of_a_saved_open_spec_without_key_is_refused(self, fake_bin: Path) -> None:
        """A stopped instance is started again from spec.json, which holds no key."""
        from buun_tool.server.instance import Instance

        s, _ = spec.resolve(None, name="open", **_GIVEN, host="0.0.0.0", api_key="k")
        Instance("open").write_spec(s.to_json())
        r = CliRunner().invoke(app, ["restart", "open"])
        assert r.exit_code == 2 and "--no-api-key" in flat(r.stderr)
        s.no_api_key = True  # said at `buun start --no-api-key`: kept in the spec, so a restart may
        spec.check_exposure(spec.LaunchSpec.from_json(json.loads(json.dumps(s.to_json()))), None)


class TestSetupFlags:
    """`buun setup -- FLAGS` gives llama-server the flags with the default recipe, as `buun serve`
    does: click hands the first word after `--` to RECIPE, and a recipe that starts with '-' is
    the first flag. Before `--` an unknown option is an error, not a flag passed on."""

    def test_flags_after_double_dash_without_a_recipe(self) -> None:
        r = CliRunner().invoke(app, ["setup", "--dry-run", "--", "-c", "1234"])
        assert r.exit_code == 0, flat(r.stderr)
        assert " -c 1234 " in flat(r.stdout) and "unknown recipe" not in flat(r.stderr)
        r = CliRunner().invoke(app, ["setup", "--dry-run", "--", "--host", "0.0.0.0"])
        assert r.exit_code == 2 and "--host (in the arguments after `--`) is set by buun itself" in flat(r.stderr)

    def test_a_mistyped_option_is_refused(self) -> None:
        r = CliRunner().invoke(app, ["setup", "--dryrun"])
        assert r.exit_code == 2 and "No such option: --dryrun" in flat(r.output)


class TestModelsFolder:
    """The launch records the models folder it took the recipe's models from; `buun restart
    --models-dir` takes them from another one."""

    def test_a_launch_from_the_folder_records_it(self, fake_bin: Path, tmp_path: Path) -> None:
        s, _ = spec.resolve(None, models_dir=tmp_path, need_models=False)
        assert s.models_dir == str(tmp_path) and s.target.startswith(f"{tmp_path}/target/")
        moved = spec.with_models_dir(s, tmp_path / "other")
        assert moved.models_dir == str(tmp_path / "other") and moved.draft.startswith(f"{tmp_path}/other/gguf/")
        assert (moved.flags, moved.name) == (s.flags, s.name)

    def test_a_recipe_file_given_by_a_relative_path_is_found_again_from_elsewhere(
            self, fake_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        # `buun restart --models-dir` reloads the recipe from the spec: a path relative to the folder
        # of the first launch would name another file, or none, from the folder of the restart
        shipped = recipes.available()[recipes.DEFAULT_RECIPE]
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "pair.yaml").write_text(shipped.read_text())
        monkeypatch.chdir(tmp_path / "mine")
        s, _ = spec.resolve("pair.yaml", models_dir=tmp_path, need_models=False)
        assert s.recipe_source == str(tmp_path / "mine" / "pair.yaml")
        monkeypatch.chdir(tmp_path)
        moved = spec.with_models_dir(s, tmp_path / "other")
        assert moved.draft.startswith(f"{tmp_path}/other/gguf/")

    def test_models_given_by_path_have_no_folder_to_move(self, fake_bin: Path) -> None:
        s, _ = spec.resolve(None, **_GIVEN)
        assert s.models_dir is None
        with pytest.raises(UsageError, match="serves models given by path"):
            spec.with_models_dir(s, Path("/elsewhere"))

    def test_restart_from_a_folder_without_the_models_says_so(self, fake_bin: Path, tmp_path: Path) -> None:
        from buun_tool.server.instance import Instance

        s, _ = spec.resolve(None, name="moved", models_dir=tmp_path, need_models=False)
        Instance("moved").write_spec(s.to_json())
        r = CliRunner().invoke(app, ["restart", "moved", "--models-dir", str(tmp_path / "empty")])
        assert r.exit_code == 3 and f"{tmp_path}/empty/target/" in flat(r.stderr)
        assert Instance("moved").read_spec()["models_dir"] == str(tmp_path)  # nothing changed


class TestOneLaunch:
    """serve, start and service install take one bundle of options and resolve the same launch;
    serve and start hand it to the same control.launch, serve with the supervisor in the foreground."""

    ARGS = ("--name", "same", "--port", "9123", "--drop", "-cd", "--max-crashes", "4", "--", "-c", "2048")

    def test_the_three_commands_resolve_one_launch(self, fake_bin: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        from buun_tool.server import control
        from buun_tool.server.instance import Instance

        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
        models = tmp_path / "m"
        models.mkdir()
        for f in ("t.gguf", "d.gguf"):
            (models / f).write_bytes(b"GGUF")
        launched: dict[str, tuple] = {}

        def launch(resolved: spec.LaunchSpec, key: str | None, **how) -> None:
            launched["serve" if how.get("foreground") else "start"] = (resolved, how)

        monkeypatch.setattr(control, "launch", launch)
        given = ["--model", str(models / "t.gguf"), "--draft", str(models / "d.gguf"), *self.ARGS]
        for cmd in ("serve", "start"):
            r = CliRunner().invoke(app, [cmd, *given])
            assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["service", "install", *given])  # its unit runs the spec it saves
        assert r.exit_code == 0, r.output

        def settings(spec_json: dict) -> dict:
            return {k: v for k, v in spec_json.items() if k != "run_id"}

        serve_spec, start_spec = launched["serve"][0], launched["start"][0]
        assert settings(serve_spec.to_json()) == settings(start_spec.to_json())
        assert settings(serve_spec.to_json()) == settings(Instance("same").read_service_spec())
        assert serve_spec.port == 9123 and serve_spec.policy.max_crashes == 4
        assert dict(serve_spec.flags)["-c"] == "2048" and "-cd" not in dict(serve_spec.flags)
        assert "wait" in launched["start"][1] and "foreground" not in launched["start"][1]


class TestTreeBudget:
    """The tree budget (patch 0023): --tree-budget, the recipe's server.tree, or a flag after `--`."""

    ARGS = ["--model", "/m/t.gguf", "--draft", "/m/d.gguf", "--print-cmd"]

    def argv(self, *args: str, recipe: str | None = None) -> list[str]:
        r = CliRunner().invoke(app, ["serve", *([recipe] if recipe else []), *self.ARGS, *args])
        assert r.exit_code == 0, r.output
        return r.stdout.split()

    @staticmethod
    def tree(argv: list[str]) -> list[str]:
        return [t for i, t in enumerate(argv) if t.startswith("--spec-tree") or argv[i - 1].startswith("--spec-tree")]

    def test_the_shipped_recipe_serves_the_chain_without_a_tree_flag(self, fake_bin: Path) -> None:
        """0 is llama-server's default: a build without patch 0023 serves the recipe as before."""
        assert self.tree(self.argv()) == [] and self.tree(self.argv("--tree-budget", "1")) == []

    @pytest.mark.parametrize("cmd", ["serve", "start"])
    def test_the_command_line_sets_a_tree_with_the_recipes_k(self, fake_bin: Path, cmd: str) -> None:
        if cmd == "serve":
            assert self.tree(self.argv("--tree-budget", "22")) == ["--spec-tree-budget", "22", "--spec-tree-k", "8"]
        else:  # start has no --print-cmd: what it would run is its resolved spec
            s, _ = spec.resolve(None, **_GIVEN, tree_budget=22)
            assert self.tree(s.argv) == ["--spec-tree-budget", "22", "--spec-tree-k", "8"]
            r = CliRunner().invoke(app, ["start", *self.ARGS[:4], "--tree-budget", "-1"])
            assert r.exit_code == 2 and "--tree-budget -1: expected 0 or more draft nodes" in flat(r.stderr)

    def test_the_recipes_tree_and_its_override(self, fake_bin: Path) -> None:
        _user_recipe("treed", {}, tree={"budget": 16, "k": 4})
        assert self.tree(self.argv(recipe="treed")) == ["--spec-tree-budget", "16", "--spec-tree-k", "4"]
        assert self.tree(self.argv("--tree-budget", "0", recipe="treed")) == []  # back to the chain
        assert self.tree(self.argv("--tree-budget", "32", recipe="treed")) == [
            "--spec-tree-budget", "32", "--spec-tree-k", "4"]
        # a budget among the recipe's own flags is the recipe's: the command line replaces it
        _user_recipe("flagged", {"--ddtree-budget": 22})
        assert self.tree(self.argv(recipe="flagged")) == ["--spec-tree-budget", "22", "--spec-tree-k", "8"]
        assert self.tree(self.argv("--tree-budget", "0", recipe="flagged")) == []

    def test_any_spelling_after_dashes_and_a_k_of_ones_own(self, fake_bin: Path) -> None:
        assert self.tree(self.argv("--", "--ddtree-budget", "16")) == ["--spec-tree-budget", "16", "--spec-tree-k", "8"]
        assert self.tree(self.argv("--tree-budget", "22", "--", "--spec-tree-k", "4")) == [
            "--spec-tree-k", "4", "--spec-tree-budget", "22"]

    @pytest.mark.parametrize("args, message", [
        (["--tree-budget", "-3"], "--tree-budget -3: expected 0 or more draft nodes"),
        (["--", "--spec-tree-budget=-3"], "--spec-tree-budget -3: expected a whole number of draft nodes"),
        (["--", "--tree-budget", "many"], "--spec-tree-budget many: expected a whole number of draft nodes"),
        (["--", "--tree-budget"], "--spec-tree-budget without a value: expected a whole number of draft nodes"),
        (["--tree-budget", "3", "--", "--tree-budget", "4"], "--tree-budget and a --spec-tree-budget after `--` both"),
        (["--tree-budget", "64"], "a tree budget of 64 verifies 65 tokens in one ubatch, more than -ub 64"),
        (["--tree-budget", "40", "--", "-ub", "32"], "pass a budget of at most 31, or a larger ubatch (`-- -ub 41"),
    ])
    def test_a_budget_that_cannot_be_served_says_why_and_what_to_do(self, fake_bin: Path, args: list[str],
                                                                      message: str) -> None:
        r = CliRunner().invoke(app, ["serve", *self.ARGS, *args])
        assert r.exit_code == 2 and message in flat(r.stderr), r.output
        assert "hint:" in flat(r.stderr)

    def test_a_tree_that_fits_a_larger_ubatch(self, fake_bin: Path) -> None:
        argv = self.argv("--tree-budget", "64", "--", "-ub", "128")
        assert self.tree(argv)[:2] == ["--spec-tree-budget", "64"]


class TestSlots:
    """Several slots (-np N): --slots, the recipe's server.slots, or a -np after `--`; the ubatch grows
    with them so that every slot's verify (16 tokens) fits one target forward."""

    ARGS = TestTreeBudget.ARGS

    def run(self, *args: str, recipe: str | None = None):
        return CliRunner().invoke(app, ["serve", *([recipe] if recipe else []), *self.ARGS, *args])

    def flags(self, *args: str, recipe: str | None = None) -> dict[str, str]:
        r = self.run(*args, recipe=recipe)
        assert r.exit_code == 0, r.output
        argv = r.stdout.split()
        return {k: argv[argv.index(k) + 1] for k in ("-np", "-ub", "-b", "-c")}

    def test_slots_set_np_and_a_ubatch_that_holds_their_verify(self, fake_bin: Path) -> None:
        assert self.flags() == {"-np": "1", "-ub": "64", "-b": "256", "-c": "6048"}
        # 6048 tokens a slot without a GPU to fit; -c is the slots' total
        assert self.flags("--slots", "4") == {"-np": "4", "-ub": "64", "-b": "256", "-c": str(4 * 6048)}
        assert self.flags("--slots", "8")["-ub"] == "128"
        assert self.flags("--slots", "8", "--", "-c", "8192")["-c"] == "8192"

    def test_the_recipes_slots_and_a_np_after_dashes(self, fake_bin: Path) -> None:
        _user_recipe("team", {}, slots=3)
        assert self.flags(recipe="team")["-np"] == "3"
        assert self.flags("--slots", "2", recipe="team")["-np"] == "2"
        assert self.flags("--", "--parallel", "6")["-np"] == "6"
        assert self.flags("--", "--parallel", "6")["-ub"] == "96"

    def test_a_ubatch_of_ones_own_is_kept_with_a_warning(self, fake_bin: Path) -> None:
        r = self.run("--slots", "8", "--", "-ub", "64")
        assert r.exit_code == 0 and " -ub 64 " in r.stdout and " -np 8 " in r.stdout
        assert "8 slots verify 128 tokens a step, more than -ub 64" in flat(r.stderr)

    @pytest.mark.parametrize("args, message", [
        (["--slots", "0"], "0 slots: buun serves 1 to 8"),
        (["--slots", "9"], "9 slots: buun serves 1 to 8"),
        (["--slots", "2", "--", "-np", "3"], "--slots and a -np after `--` both set the number of slots"),
        (["--", "-np", "many"], "-np many: expected a whole number"),
        (["--slots", "2", "--tree-budget", "22"], "a DDTree (tree budget 22) verifies one slot"),
    ])
    def test_slots_that_cannot_be_served_say_why(self, fake_bin: Path, args: list[str], message: str) -> None:
        r = self.run(*args)
        assert r.exit_code == 2 and message in flat(r.stderr), r.output
        assert "hint:" in flat(r.stderr)

    def test_start_resolves_the_slots(self, fake_bin: Path) -> None:
        s, _ = spec.resolve(None, **_GIVEN, slots=4)
        assert s.argv[s.argv.index("-np") + 1] == "4"


class TestServerSettings:
    """settings.py: the launch plan resolved once (typed as `plan`) and rendered once; serve's spec,
    bench's configurations and fit --measure all render through ServerSettings.render."""

    def test_the_plan_types_what_the_flags_say(self, fake_bin: Path) -> None:
        s, _ = spec.resolve(None, **_GIVEN, extra=["-c", "8192", "-ctk", "q8_0"], slots=2)
        plan = s.settings.plan
        assert (plan.ctx, plan.n_parallel, plan.cache_type_k, plan.cache_type_v) == (8192, 2, "q8_0", "q8_0")
        assert plan.spec and plan.ubatch >= 2 * (min(plan.draft_max, 15) + 1) and plan.batch >= plan.ubatch
        tree, _ = spec.resolve(None, **_GIVEN, tree_budget=22)
        assert tree.settings.plan.tree_budget == 22 and tree.settings.plan.tree

    def test_a_server_without_a_drafter_plans_no_draft(self) -> None:
        plain = settings.ServerSettings([("-c", "4096"), ("-np", "3")])
        assert plain.plan.draft_max == 0 and not plain.plan.spec and plain.plan.n_parallel == 3

    def test_spec_renders_through_the_settings(self, fake_bin: Path) -> None:
        s, _ = spec.resolve(None, **_GIVEN, gpus=None)
        launch = s.launch()
        assert launch.argv == s.argv == s.settings.render(s.binary, s.target, s.draft, s.host, s.port,
                                                          alias=s.recipe).argv
        assert launch.argv[:5] == [s.binary, "-m", s.target, "-md", s.draft]
        assert launch.argv[-5:] == ["--host", s.host, "--port", str(s.port), "--metrics"]
        key = "zz-key-zz"
        assert launch.environ(key)["LLAMA_API_KEY"] == key and key not in launch.display(key)

    def test_a_render_without_a_drafter_has_no_md(self) -> None:
        launch = settings.ServerSettings([("-c", "64")], env={"CUDA_VISIBLE_DEVICES": "1"}).render(
            "/b/llama-server", "/m/t.gguf", None, "127.0.0.1", 9000)
        assert "-md" not in launch.argv and launch.env == {"CUDA_VISIBLE_DEVICES": "1"}
        assert launch.display().startswith("CUDA_VISIBLE_DEVICES=1 /b/llama-server -m /m/t.gguf -c 64")
