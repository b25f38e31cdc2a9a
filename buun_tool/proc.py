"""Running external commands: captured, logged, and failing with the command's last lines."""

from __future__ import annotations

import collections
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from buun_tool.errors import CommandError


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
        [str(c) for c in cmd], cwd=cwd, env=full_env, input=input, capture_output=True, text=True
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
            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if on_line:
                    on_line(line.rstrip("\n"))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        code = proc.wait()
    if code != 0:
        last = "\n".join(tail)
        raise CommandError(
            f"{what} failed (exit {code}). Last lines:\n{last}\n  full log: {log_path}",
            hint, log_tail=last, log_path=str(log_path),
        )
