"""One lock per thing the pipeline stages change: the vendored tree, a build folder, the upstream
source export, a models folder and the converter's environment.

Two buun commands that change one of these at once break it: two `git am` in one tree abort each
other, two downloads append to one partial file (and to the file the first one renamed into place),
one convert deletes the other's half-written GGUF. So each stage's function holds the lock of what
it changes (fcntl.flock, as an instance's supervisor holds its own): a second command waits, says
once on stderr for which command and process, then goes on and finds the work done. A build holds
the vendored tree shared (it only reads it: builds of two variants run side by side, a patch
waits), and so does a convert (it runs the tree's converter script and gguf-py). The kernel
drops a flock when its process dies, however it dies, so no lock outlives its holder; the
descriptor is not inherited (Python opens it close-on-exec), so no program a stage starts
(cmake, git, the converter) keeps it once buun is gone, and no stage holds one while `buun
setup` serves. Commands that only read (status, doctor, --dry-run, fit, `patch
--status/--check`) take none and never wait.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from buun_tool.base import console, paths
from buun_tool.base.command import is_count


@contextlib.contextmanager
def held(lock_file: Path, what: str, shared: bool = False) -> Iterator[None]:
    """The lock of `what` (named in the waiting line) for the block; waits while another process
    holds it (any holder when exclusive, an exclusive one when `shared`). A Ctrl-C while waiting is
    a KeyboardInterrupt like any other: exit 130."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            console.info(f"waiting for {_holder(fd)} to finish with {what} ...")
            fcntl.flock(fd, mode)
        # who holds it, for the next one to wait: one line, read back by _holder (shared holders
        # each write theirs; the last one's stands)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_command()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _command() -> str:
    """`buun setup`, `buun pull`: the command this process runs, by its first word (the others may
    hold a key or a token); a program of another name (a script that imports buun) by that name."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "buun" or sys.argv[0].endswith(os.path.join("buun_tool", "__main__.py")):
        return " ".join(["buun", *[a for a in sys.argv[1:] if not a.startswith("-")][:1]])
    return program


def _holder(fd: int) -> str:
    """`buun build` (PID 4242), from the lock file's line while that process lives; a line left by
    a holder that is gone (the lock is another's now) names nobody."""
    pid, _, command = os.pread(fd, 256, 0).decode(errors="replace").partition("\n")[0].partition(" ")
    if is_count(pid) and command and psutil.pid_exists(int(pid)):
        return f"`{command}` (PID {pid})"
    return "another buun command"


# --- the resources --------------------------------------------------------------------------

def vendor_tree(shared: bool = False) -> contextlib.AbstractContextManager[None]:
    """The vendored llama.cpp (vendor, patch; a build reads it, shared). Its lock file lies beside
    it, not in it: `buun vendor` replaces the whole folder."""
    tree = paths.llama_dir()
    return held(tree.parent / f".{tree.name}.lock", f"the vendored tree {tree}", shared)


def build_folder(name: str) -> contextlib.AbstractContextManager[None]:
    """A build folder (cpu, cuda, upstream-cpu, ...): its cmake cache, objects, binaries and stamp."""
    folder = paths.build_dir(name)
    return held(folder.parent / f".{name}.lock", f"the build folder {folder}")


def converter_env(env: Path) -> contextlib.AbstractContextManager[None]:
    """The converter's environment, made once for every models folder. Its lock file lies beside
    it: a stale environment is removed whole and made again."""
    return held(env.parent / f".{env.name}.lock", f"the converter environment {env}")


# errno values of a lock file that cannot be made: a folder this user may not write, a read-only mount
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextlib.contextmanager
def models_folder(models: Path, unwritable_ok: bool = False) -> Iterator[OSError | None]:
    """A models folder (pull, drafter, convert): the lock file lies in it, the one folder there
    that is sure to be buun's (--models-dir may name one in a folder that is not this user's).
    A folder not made yet holds nothing to protect: pull makes it first; drafter and convert go on
    and say what is missing (a mistyped --models-dir leaves no folder behind).

    Yields None while it holds the lock. With `unwritable_ok`, a folder where the lock file cannot
    be made (a read-only mount, another user's folder) yields that error instead, unlocked: the
    caller may only read there, to say its work is already done (nothing it wrote would land, and
    a writer's files are renamed into place whole)."""
    unwritable = None
    with contextlib.ExitStack() as stack:
        if models.is_dir():
            try:
                stack.enter_context(held(models / ".buun.lock", f"the models folder {models}"))
            except OSError as exc:
                if not (unwritable_ok and exc.errno in UNWRITABLE):
                    raise
                unwritable = exc
        yield unwritable


def upstream_source(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The export of the unpatched pin that the upstream builds of every variant compile: one
    makes it while another waits (both made it at once, each removing the other's half)."""
    return held(folder.parent / f".{folder.name}.lock", f"the upstream source {folder}")
