"""Errors a user can act on.

Every failure buun expects carries what went wrong, the next thing to do and its own exit
code, so scripts can tell a missing download from a failed build. The CLI prints them without
a traceback (set BUUN_DEBUG=1 to see one).
"""

from __future__ import annotations

import errno
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # a check or a stage failed
    USAGE = 2  # bad arguments, bad recipe, bad input file
    NOT_READY = 3  # a stage this one needs has not run (no vendor tree, no build, no model)
    NETWORK = 4  # could not reach a source
    NOT_FOUND = 5  # repo, revision or file does not exist
    GATED = 6  # access to a repo must be requested or a token is missing
    DISK = 7  # not enough disk space
    CONFLICT = 8  # something else holds the resource (port, lock, dirty tree)
    INTERRUPTED = 130


# What a Ctrl-C prints, wherever it lands: every stage resumes where it stopped.
INTERRUPTED = "interrupted: re-run the same command to resume"


def exit_interrupted() -> None:
    """One line and exit 130; a second Ctrl-C while it prints must not turn it into a traceback."""
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write(f"{INTERRUPTED}\n")
    sys.stderr.flush()
    raise SystemExit(int(Exit.INTERRUPTED))


class Terminated(SystemExit):
    """A SIGTERM or SIGHUP (`kill`, systemd, a closed terminal) raised where the program is: their
    default action ends Python at once, skipping its `finally` blocks (a half-written file left
    under its temporary name, a child left running). Exits 128 + the signal, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


_terminating = False


def raise_terminated(signum: int, frame: object) -> None:
    """The handler of SIGTERM and SIGHUP for every command (`python -m buun_tool` installs it);
    the supervisor (`buun serve`, `buun worker`) puts its own in its place while it runs, then
    puts it back; LocalServer installs this one for SIGTERM, for a caller that has none."""
    global _terminating
    if _terminating:  # a second one must not cut short the cleanup the first one started
        return  # (SIGKILL still ends it at once)
    _terminating = True
    raise Terminated(signum)


def exit_terminated(exc: Terminated) -> None:
    """exit_interrupted's line for a SIGTERM or SIGHUP, and its exit status; after a SIGHUP the
    terminal may be gone, and the line with it."""
    import signal
    import sys

    try:
        sys.stderr.write(f"stopped by {signal.Signals(exc.signum).name}: re-run the same command to resume\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    raise SystemExit(exc.code) from None


class BuunError(Exception):
    """A failure with a message for the user and a hint saying what to do next."""

    exit_code: Exit = Exit.FAILED

    def __init__(self, message: str, hint: str | None = None, exit_code: Exit | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


# errno values that mean "no room left": the disk, the user's quota on it, or a file past the size
# the file system (FAT32: 4 GiB) or `ulimit -f` allows (Python ignores SIGXFSZ, so a write gets EFBIG)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(exc: OSError, what: str | None = None) -> BuunError:
    """The error for a write that found the disk full (anywhere: records, logs, downloads)."""
    where = what or (f"write {exc.filename}" if exc.filename else "finish writing")
    if exc.errno == errno.EFBIG:
        return BuunError(f"could not {where}: the file grew past the largest one this file system or the "
                         "file-size limit (`ulimit -f`) allows",
                         "write it to another file system (FAT32 holds 4 GiB a file at most) or raise the limit, "
                         "then run the same command again: nothing half-written was left behind", Exit.DISK)
    return BuunError(f"the disk is full: could not {where} ({exc.strerror or 'no space left on device'})",
                     "free some space (`df -h` shows where) and run the same command again: finished work is "
                     "kept and nothing half-written was left behind", Exit.DISK)


class UsageError(BuunError):
    exit_code = Exit.USAGE


# errno values of a path that cannot be used as it is: missing, a file where a folder must be (or
# the reverse), or out of this user's reach
PATH_ERRORS = {
    errno.ENOENT: "it, or a folder above it, does not exist",
    errno.EEXIST: "a file is there where a folder must be",
    errno.ENOTDIR: "a file is on the way, where a folder must be",
    errno.EISDIR: "a folder is there where a file must be",
    errno.EACCES: "this user may not use it",
    errno.EPERM: "this user may not use it",
    errno.EROFS: "it is on a read-only file system",
}


def path_error(exc: OSError) -> BuunError:
    """The error for a path a command cannot use as it is (an --out that names a file, a folder that
    cannot be made, one without permission), wherever it strikes."""
    return UsageError(f"cannot use {exc.filename}: {exc.strerror} ({PATH_ERRORS[exc.errno]})",
                      "give another path or fix this one, then run the same command again "
                      "(BUUN_DEBUG=1 shows where it failed)")


class NotReadyError(BuunError):
    exit_code = Exit.NOT_READY


class CommandError(BuunError):
    """An external command (git, cmake, the converter) failed; `log_tail` holds its last lines."""

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "", log_path: str | None = None):
        super().__init__(message, hint)
        self.log_tail = log_tail
        self.log_path = log_path
