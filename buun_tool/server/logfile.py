"""The instance log: written with size-based rotation, read back with tail and follow.

The supervisor writes llama-server's output and its own events (prefixed "[buun]") to
server.log; past `max_bytes` it becomes server.log.1 (older ones shift up, `keep` are kept). Logs
are private (0600) like the rest of the instance folder: they show paths, flags and requests.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from buun_tool.fsutil import open_private, private_dir

DEFAULT_MAX_BYTES = 10 * 2**20
DEFAULT_KEEP = 3


class RotatingLog:
    """Append-only text log, safe to write from the reader thread and the loop at once."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP):
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._lock = threading.Lock()
        private_dir(path.parent)
        self._f = open_private(path)

    def write(self, line: str) -> None:
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8", "replace")
        with self._lock:
            if self._f.tell() + len(data) > self.max_bytes and self._f.tell() > 0:
                self._rotate()
            self._f.write(data)
            self._f.flush()

    def event(self, message: str) -> None:
        self.write(f"[buun] {time.strftime('%Y-%m-%d %H:%M:%S')} {message}")

    def _rotate(self) -> None:
        self._f.close()
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._f = open_private(self.path)

    def close(self) -> None:
        with self._lock:
            self._f.close()


def rotated(path: Path) -> list[Path]:
    """The log and its rotated files, oldest first."""
    numbered = [(int(p.suffix[1:]), p) for p in path.parent.glob(f"{path.name}.*") if p.suffix[1:].isdigit()]
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
