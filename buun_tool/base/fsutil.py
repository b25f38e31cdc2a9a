"""File helpers every stage needs the same way: hashing and crash-safe JSON records."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from buun_tool.base.command import is_count
from buun_tool.base.errors import DISK_FULL, disk_full


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: Path, data: Any, private: bool = False) -> None:
    """Write JSON so that a reader sees the old content or the new one, never half of it; on any
    failure (a full disk, Ctrl-C) the temporary file is removed and the old content stays.
    `private`: mode 0600 from the start (the temporary file is the final one)."""
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), private)


def write_atomic(path: Path, data: bytes, private: bool = False) -> None:
    """write_json_atomic's way for any bytes. A link at `path` is replaced, never written through:
    a folder someone sent may hold a report.html that points at one of the reader's files. The
    bytes reach the disk before the rename: after a power cut a service's launch (service.json)
    is the old one or the new one, not an empty file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as tmp, open_private(tmp, append=False) if private else open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def replaced(path: Path, suffix: str = "tmp") -> Iterator[Path]:
    """A temporary name beside `path` (`.NAME.PID.SUFFIX`: concurrent writers never share one) for
    the block to write; renamed over `path` when the block ends, and the rename on the disk before
    this returns. On any failure (a full disk, Ctrl-C) the temporary file is removed and the old
    `path` stays; a full disk is the error naming `path`, not the temporary file. What writers of
    `path` killed outright left is removed first (clear_leftovers)."""
    clear_leftovers(path.parent, suffix, path.name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
        _sync_dir(path.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise disk_full(exc, f"write {path}") from exc
        raise


# How much later than a temporary file's last change its PID's process must have started to be
# another one: psutil's start time counts from the boot time in whole seconds, and a clock set
# forward moves it; too small a margin would take a live writer's file for a dead one's.
PID_REUSE_MARGIN_S = 60.0


def clear_leftovers(folder: Path, suffix: str, name: str | None = None) -> None:
    """The temporary files or folders (`.NAME.PID.SUFFIX`, as `replaced` names them) of writers that were
    killed outright (SIGKILL, the OOM killer, a power cut: their own cleanup never ran), of `name`
    or of any file in `folder`. A file stays while its PID runs a process that was there when the
    file last changed: a live writer's, to finish. A PID whose process started later was reused.
    Another user's file stays too: whether its writer lives is not ours to judge (it may run in
    a PID namespace of its own, and the folder may not let us remove it). A writer in another PID
    namespace of this user (another container sharing the folder) cannot be seen from here."""
    pattern = f".{glob.escape(name) if name is not None else '*'}.*.{glob.escape(suffix)}"
    for tmp in folder.glob(pattern):
        stem, _, pid = tmp.name[1:-len(suffix) - 1].rpartition(".")
        if (name is not None and stem != name) or not is_count(pid):
            continue
        try:
            st = tmp.lstat()
            if st.st_uid != os.geteuid() or _writes(int(pid), st.st_mtime):
                continue
            if stat.S_ISDIR(st.st_mode):  # a scratch folder (vendor's)
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink()
        except FileNotFoundError:  # its writer renamed it meanwhile, or another run cleared it
            pass


def _writes(pid: int, changed: float) -> bool:
    """Whether process `pid` may be the one that changed the file at `changed` (epoch seconds)."""
    try:
        return psutil.Process(pid).create_time() <= changed + PID_REUSE_MARGIN_S
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to see: take it for alive
        return True


def _sync_dir(folder: Path) -> None:
    """The folder's entries to disk (a rename is one); where a file system cannot, nothing."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# A server's state, spec and logs name its models, flags and requests: only their owner reads them.
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def private_dir(path: Path) -> Path:
    """A folder only its owner can enter; one made earlier with a wider mode is narrowed."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def open_private(path: Path, append: bool = True) -> BinaryIO:
    """`path` opened for writing (appending or from empty) with mode 0600, whatever the umask and
    whatever mode the file had."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return os.fdopen(fd, "ab" if append else "wb")
