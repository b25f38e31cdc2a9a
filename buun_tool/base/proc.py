"""Running external commands: captured, logged, and failing with the command's last lines. None
outlives buun: each dies with it (dies_with_us), and one that an exception interrupts (Ctrl-C,
SIGTERM, a full disk while logging) is stopped with everything it started (stop_tree)."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from buun_tool.base.errors import CommandError

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: the child must not import
except (OSError, AttributeError):  # not Linux
    _prctl = None


def dies_with_us() -> Callable[[], None]:
    """A preexec_fn: the kernel SIGKILLs the child when this process dies, also when it dies
    without running any code of its own (SIGKILL, the OOM killer), instead of leaving it to run
    until it next writes to the pipe we read (a converter, llama-quantize, llama-server).

    The death signal follows the *thread* that forked: a child kept beyond the call that started
    it must come from the main thread. It is not inherited either: what the child starts (ninja
    under `cmake --build`, ninja's compilers) lives on. Reaching those would take a process of
    ours that outlives us (a subreaper watching the tree): too much for what is left, since ninja
    dies at its next status line (the pipe it writes has no reader left: SIGPIPE) and its
    compilers, each in a process group of its own, end with the file they compile, whole. SIGKILL,
    not SIGTERM, because cmake --build lets SIGTERM wait for ninja's end."""
    parent = os.getpid()

    def arm() -> None:  # in the child, between fork and exec
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return arm


def stop_tree(proc: subprocess.Popen[str], grace: float = 5.0) -> None:
    """Stop a child and every process under it, for an exception that interrupts it: SIGTERM to
    each, then SIGKILL to what is left after `grace`. Each one, not the child's process group:
    ninja puts each compiler in a group of its own, and on SIGTERM stops them so that they remove
    their half-written output; cmake --build waits for ninja, then exits."""
    try:
        top = psutil.Process(proc.pid)
        tree = [top, *top.children(recursive=True)]  # listed before any dies: orphans have no parent to find them by
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + grace
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs(tree[1:], timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.kill()
    proc.wait()


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    what: str | None = None,
    hint: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a short command, capturing its output; raise CommandError on failure when `check`."""
    full_env = {**os.environ, **env} if env else None
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=full_env, input=input, capture_output=True, text=True,
        preexec_fn=dies_with_us(),
    )
    if check and proc.returncode != 0:
        name = what or " ".join(str(c) for c in cmd[:3])
        tail = (proc.stderr or proc.stdout).strip()
        raise CommandError(f"{name} failed (exit {proc.returncode}):\n{tail[-2000:]}", hint, log_tail=tail)
    return proc


def git(repo: Path, *args: str, check: bool = True, input: str | None = None,
        env: dict[str, str] | None = None) -> str:
    return run(["git", "-C", str(repo), *args], check=check, input=input, env=env,
               what=f"git {args[0]}").stdout.strip()


def run_logged(
    cmd: Sequence[str | os.PathLike[str]],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    what: str,
    hint: str | None = None,
    tail_lines: int = 30,
) -> None:
    """Run a long command (a build, a conversion) with every line appended to `log_path`.

    On failure the error carries the last lines and the log's path, so the user sees the cause
    without opening the log, and can open it for the rest.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    full_env = {**os.environ, **env} if env else None
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(str(c) for c in cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, preexec_fn=dies_with_us(),
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if on_line:
                    on_line(line.rstrip("\n"))
        except BaseException:
            stop_tree(proc)
            raise
        code = proc.wait()
    if code != 0:
        last = "\n".join(tail)
        raise CommandError(
            f"{what} failed (exit {code}). Last lines:\n{last}\n  full log: {log_path}",
            hint, log_tail=last, log_path=str(log_path),
        )
