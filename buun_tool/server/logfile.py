"""The instance log: written with size-based rotation, read back with tail and follow.

The supervisor writes llama-server's output and its own events (prefixed "[buun]") to
server.log; past `max_bytes` it becomes server.log.1 (older ones shift up, `keep` are kept). A
detached supervisor's own output, supervisor.log, rotates the same way. Logs are private (0600)
like the rest of the instance folder: they show paths, flags and requests.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from buun_tool.base.command import is_count
from buun_tool.base.fsutil import open_private, private_dir

DEFAULT_MAX_BYTES = 10 * 2**20
DEFAULT_KEEP = 3


class RotatingLog:
    """Append-only text log, safe to write from the reader thread and the loop at once.

    Writing never raises: the supervisor reads llama-server's output through a pipe, and a reader
    that stopped on a full disk (or a file-size limit) would leave llama-server blocked on its next
    write, hung, and a supervisor that raised would take it down. A line that cannot be written is
    counted and the count logged once writing works again. A log deleted (or moved) while running
    is made again at the next write, so `buun logs` keeps showing the output.

    `follow`: fds (a detached supervisor's stdout and stderr) pointed at the file at each (re)open,
    so what the process writes there other than through this log (a traceback) lands in the
    current file, not in a rotated one that is later deleted; the size counts those writes too."""

    REOPEN_CHECK_S = 1.0  # how often a write checks that the path is still the file it writes

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP,
                 follow: tuple[int, ...] = ()):
        self.path, self.max_bytes, self.keep, self.follow = path, max_bytes, keep, follow
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._checked = 0.0
        self.dropped = 0  # lines lost since the last successful write
        self._why = ""
        try:
            self._open()
        except OSError as exc:  # a full disk: the first write tries again
            self.dropped, self._why = 0, exc.strerror or str(exc)

    def _open(self) -> None:
        """(Re)open the path, making the file (and its folder) when they are gone."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        private_dir(self.path.parent)
        with open_private(self.path) as f:
            self._fd = os.dup(f.fileno())  # unbuffered: a failed write keeps nothing to flush later
        for fd in self.follow:
            os.dup2(self._fd, fd)
        self._size = os.fstat(self._fd).st_size
        self._checked = time.monotonic()

    def _check_due(self) -> bool:
        now = time.monotonic()
        if now - self._checked < self.REOPEN_CHECK_S:
            return False
        self._checked = now
        return True

    def _moved(self) -> bool:
        """Is the path no longer the file we write (deleted or moved away by someone else)?"""
        assert self._fd is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(self._fd)
        return (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)

    def write(self, line: str) -> None:
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8", "replace")
        with self._lock:
            try:
                if self._fd is None or self._check_due() and self._moved():
                    self._open()
                if self.dropped:
                    note = (f"[buun] {time.strftime('%Y-%m-%d %H:%M:%S')} {self.dropped} line(s) of output were "
                            f"lost: the log could not be written ({self._why})\n").encode()
                    self._append(note)
                    self.dropped = 0
                self._append(data)
            except OSError as exc:
                self.dropped += 1
                self._why = exc.strerror or str(exc)

    def _append(self, data: bytes) -> None:
        if self.follow:  # the followers' writes bypass the count
            assert self._fd is not None
            self._size = os.fstat(self._fd).st_size
        if self._size + len(data) > self.max_bytes and self._size > 0:
            self._rotate()
        assert self._fd is not None
        view = memoryview(data)
        while view:  # O_APPEND: each piece lands at the end
            n = os.write(self._fd, view)
            self._size += n
            view = view[n:]

    def event(self, message: str) -> None:
        self.write(f"[buun] {time.strftime('%Y-%m-%d %H:%M:%S')} {message}")

    def _rotate(self) -> None:
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        try:
            if self.keep > 0:
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            else:
                self.path.unlink(missing_ok=True)
        except FileNotFoundError:  # deleted meanwhile: start the new file all the same
            pass
        self._open()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def rotated(path: Path) -> list[Path]:
    """The log and its rotated files, oldest first."""
    numbered = [(int(p.suffix[1:]), p) for p in path.parent.glob(f"{path.name}.*") if is_count(p.suffix[1:])]
    return [p for _, p in sorted(numbered, reverse=True)] + ([path] if path.exists() else [])


def tail(path: Path, n: int) -> list[str]:
    """The last `n` lines across the log and its rotated files."""
    out: collections.deque[str] = collections.deque(maxlen=max(n, 0))
    if n <= 0:
        return []
    for p in rotated(path):
        with open(p, encoding="utf-8", errors="replace") as f:
            for line in f:
                out.append(line.rstrip("\n"))
    return list(out)


def follow(path: Path, poll: float = 0.25, stop: threading.Event | None = None) -> Iterator[str]:
    """Lines appended to the log from now on, across rotations: the file is opened at its end
    the first time, and a new file (rotated in) is read from its start."""
    f = None
    inode = None
    first = True
    try:
        while stop is None or not stop.is_set():
            if f is None and path.exists():
                f = open(path, encoding="utf-8", errors="replace")
                inode = os.fstat(f.fileno()).st_ino
                if first:
                    f.seek(0, os.SEEK_END)
                first = False
            if f is not None:
                line = f.readline()
                if line:
                    yield line.rstrip("\n")
                    continue
                try:
                    rotated_away = os.stat(path).st_ino != inode
                except FileNotFoundError:
                    rotated_away = True
                if rotated_away:
                    for rest in f:  # written just before the rename
                        yield rest.rstrip("\n")
                    f.close()
                    f = None
                    continue
            first = False
            time.sleep(poll)
    finally:
        if f is not None:
            f.close()
