"""Ctrl-C, wherever it lands: one line, exit 130, never a traceback. Real SIGINTs to a real
`python -m buun_tool`, through a terminal where the command waits for one. SIGTERM and SIGHUP
(`kill`, systemd, a closed terminal) unwind the same way, with exit 128 + the signal. SIGKILL runs
no cleanup: the next run clears what it left."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from buun_tool.base.errors import INTERRUPTED
from tests.support import waits
from tests.support.tiny_checkpoints import write_recipe

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """`argv` on a terminal of its own (a session, like a shell's foreground job): its PID and the
    terminal's end to type at. Between the fork and the exec the child runs nothing of this
    process's (a fork copies none of its threads, but keeps any lock one of them held), and it gets
    SIGINT as a terminal's foreground job does, unblocked and at its default action, whatever this
    process inherited (a background job of a shell without job control ignores it)."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)  # a failed exec never goes on as a second pytest
    return pid, fd


def _drain(fd: int, seen: bytearray) -> bool:
    """What the terminal `fd` holds now, added to `seen`; False once it is closed."""
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            return False
        if not chunk:
            return False
        seen += chunk
    return True


def _read_until(fd: int, text: bytes, timeout: float) -> bytes:
    """What the terminal `fd` showed until `text` (or its close); fails the test after `timeout` s."""
    seen, open_ = bytearray(), [True]

    def shown() -> bool:
        if select.select([fd], [], [], 0.1)[0]:
            open_[0] = _drain(fd, seen)
        return text in seen or not open_[0]

    waits.until(shown, timeout, lambda: f"{text!r} on the terminal, which showed:\n{seen.decode(errors='replace')}")
    return bytes(seen)


def _end(pid: int) -> None:
    """Child `pid` (not reaped yet) killed if it still runs, and reaped."""
    if os.waitpid(pid, os.WNOHANG)[0] == 0:
        os.kill(pid, signal.SIGKILL)
        waits.until(lambda: os.waitpid(pid, os.WNOHANG)[0] != 0, 30, f"process {pid} to die of SIGKILL")


def _output_until_exit(fd: int, pid: int, timeout: float, before: bytes = b"") -> tuple[int, str]:
    """Child `pid`'s exit code and what it wrote to its terminal `fd` until then (after `before`,
    what was read of it already). It waits for the child, not for the terminal to close: a process
    the child started may hold the terminal open after the child is gone. A child still running
    after `timeout` s is killed and fails the test."""
    seen, deadline = bytearray(before), time.monotonic() + timeout
    while True:
        done = os.waitpid(pid, os.WNOHANG)
        if not done[0]:
            select.select([fd], [], [], 0.2)
        _drain(fd, seen)
        if done[0]:
            return os.waitstatus_to_exitcode(done[1]), seen.decode(errors="replace")
        if time.monotonic() > deadline:
            _end(pid)
            pytest.fail(f"still running {timeout} s after the keys; it printed:\n{seen.decode(errors='replace')}")


def _at_the_setup_prompt(recipe: Path, keys: bytes, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`buun setup` on a terminal of its own: `keys` typed at its confirmation prompt once it waits
    there; its exit code and what it printed after the prompt."""
    argv = [sys.executable, "-m", "buun_tool", "setup", "--recipe-file", str(recipe), "--cpu"]
    pid, fd = _on_a_terminal(argv, {**_env(), **(env or {})})
    try:
        prompt = _read_until(fd, b"Set up", 120)
        assert b"Set up" in prompt, prompt.decode(errors="replace")
        # The prompt is printed before buun reads the terminal. A ^C typed in between (a few
        # microseconds: the test types that quickly, one run in a few) was noted by Python's
        # handler, to act on once the read returned: it never did, nobody typed more, and buun
        # waited at the prompt until the test gave up. Keys go once buun sleeps in that read,
        # which a SIGINT interrupts.
        seen = bytearray()  # what follows the prompt's first lines: the rest of it
        waits.until_blocked_in(pid, "read", 0, 60, meanwhile=lambda: _drain(fd, seen))
        os.write(fd, keys)
    except BaseException:
        _end(pid)
        os.close(fd)
        raise
    try:
        return _output_until_exit(fd, pid, 60, bytes(seen))  # reaps it, or kills it
    finally:
        os.close(fd)


def test_ctrl_c_at_the_setup_prompt(tmp_path: Path) -> None:
    """The terminal's ^C (SIGINT to the foreground group) while `buun setup` asks to confirm."""
    status, rest = _at_the_setup_prompt(write_recipe(tmp_path / "tiny.yaml"), b"\x03")
    assert status == 130, rest
    assert INTERRUPTED in rest and "Traceback" not in rest and "Aborted" not in rest


def test_no_at_the_setup_prompt_is_a_choice(tmp_path: Path) -> None:
    """Answering "n" when `buun setup` asks printed "error: cancelled" and exited 130, as for a
    Ctrl-C: it is a choice, said as one, exit 0, and nothing is made."""
    home = tmp_path / "home"
    dirs = {var: str(home / sub) for var, sub in (("BUUN_DATA_DIR", "data"), ("BUUN_STATE_DIR", "state"),
                                                   ("BUUN_MODELS_DIR", "models"))}
    status, rest = _at_the_setup_prompt(write_recipe(tmp_path / "tiny.yaml"), b"n\r", dirs)
    assert status == 0, rest
    assert "setup cancelled; nothing was changed" in rest and "error" not in rest, rest
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))


# what a child Python says of its signals: SIGINT at Python's handler (so it was at its default
# when the child started, not ignored), and which of those the tests send it has blocked
_SIGINT_SEEN = ("import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
                "sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM, "
                "signal.SIGHUP}))")


def test_the_children_get_sigint_as_from_a_terminal() -> None:
    """Started by `nohup make test &` (a background job of a shell without job control), pytest
    inherits SIGINT ignored, and the children of these tests with it (an ignored signal stays so
    through an exec): the Ctrl-C tests waited forever. conftest gives pytest a handler, which an
    exec resets to the default, and unblocks it; the terminal's child gets it so itself. Holds
    wherever the tests are started from."""
    cmd = [sys.executable, "-c", _SIGINT_SEEN]
    piped = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=60)
    assert (piped.returncode, piped.stdout.strip()) == (0, "True []"), piped.stderr
    pid, fd = _on_a_terminal(cmd, _env())
    try:
        status, shown = _output_until_exit(fd, pid, 60)
    finally:
        os.close(fd)
    assert (status, shown.strip()) == (0, "True []"), shown


def test_sigint_at_any_moment_of_a_command() -> None:
    """SIGINT at a spread of moments from the start (while the CLI's modules load, and after): each
    run either finished or printed the one line with exit 130. The moments are fractions of how
    long the command takes on this machine, so that some land while it runs however fast or
    loaded the machine is."""
    cmd = [sys.executable, "-m", "buun_tool", "recipes"]
    t0 = time.monotonic()
    subprocess.run(cmd, env=_env(), capture_output=True, timeout=120)
    took = time.monotonic() - t0
    outcomes = []
    for delay in [took * f for f in (0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 1.5)]:
        proc = subprocess.Popen(cmd, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = waits.communicate(proc, 120)
        assert "Traceback" not in err, f"SIGINT after {delay} s:\n{err}"
        if proc.returncode == 130:
            assert err.strip().splitlines()[-1] == INTERRUPTED, err
        else:  # it had finished, or the signal came while the interpreter itself started or shut
            # down (no Python code runs then; the shell sees 130 all the same)
            assert proc.returncode in (0, -signal.SIGINT), f"after {delay} s: {proc.returncode}\n{err}"
        outcomes.append(proc.returncode)
    assert 130 in outcomes  # at least one landed while it ran


def test_the_buun_script_goes_through_the_same_handler() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["buun"] == "buun_tool.__main__:main"


def _wait_for(folder: Path, pattern: str, proc: subprocess.Popen[str], timeout: float = 60) -> Path:
    """The first file of `folder` matching `pattern`, once `proc` has made it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"no {pattern} in {folder} after {timeout} s: {proc.communicate(timeout=30)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_mid_write_unwinds(tmp_path: Path, sig: signal.Signals) -> None:
    """A `kill` of `buun synth` while it writes its target: the hidden .partial file goes (Python's
    default action skipped every `finally`, so it stayed, ~100 MB at the tiny scale, 16 GB at the
    full one), one line, and the exit status a shell gives a kill."""
    proc = subprocess.Popen([sys.executable, "-m", "buun_tool", "synth", "--scale", "tiny", "--out", str(tmp_path)],
                            env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = _wait_for(tmp_path, ".*.partial", proc)
    proc.send_signal(sig)
    _, err = waits.communicate(proc, 60)
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1] == f"stopped by {sig.name}: re-run the same command to resume", err
    assert "Traceback" not in err
    assert not partial.exists() and list(tmp_path.iterdir()) == []


def test_what_a_sigkill_left_goes_with_the_next_write_of_the_file(tmp_path: Path) -> None:
    """`kill -9` or the OOM killer: no cleanup runs, and the hidden .partial stayed for good (the
    size of the model, one more each time). The next write of the same file removes it; not the
    file of a live writer, and not another user's; a PID now another process's (started after the
    file last changed: the PID was reused) is no writer."""
    cmd = [sys.executable, "-m", "buun_tool", "synth", "--scale", "tiny", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    left = _wait_for(tmp_path, ".*.partial", proc)
    proc.kill()
    waits.communicate(proc, 30)
    assert left.exists()
    final = left.name[1:].rsplit(".", 2)[0]
    live = tmp_path / f".{final}.{os.getpid()}.partial"  # this process is writing it
    live.write_bytes(b"half")
    sleeper = subprocess.Popen(["sleep", "60"])
    reused = tmp_path / f".{final}.{sleeper.pid}.partial"
    reused.write_bytes(b"half")
    an_hour_ago = time.time() - 3600  # before the sleeper started: its PID was another process's then
    os.utime(reused, (an_hour_ago, an_hour_ago))
    gone = subprocess.Popen(["true"])
    gone.wait(30)
    foreign = tmp_path / f".{final}.{gone.pid}.partial"
    if os.geteuid() == 0:  # another user's, its PID gone too (only root can make one)
        foreign.write_bytes(b"half")
        os.chown(foreign, 65534, 65534)
    try:
        again = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait(30)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / final).is_file()
    assert not left.exists() and not reused.exists() and live.exists()
    assert foreign.exists() == (os.geteuid() == 0)
