"""The instance's files a supervisor keeps while it runs: its record, written again when a write
failed (a full disk) or the file changed under it; its launch spec, which `buun restart` relaunches
from; and its lock, taken again on a lock file made again. None of them is a reason to stop
supervising a server that serves (docs/design.md)."""

from __future__ import annotations

import os
from pathlib import Path

from buun_tool.base.errors import BuunError
from buun_tool.server.instance import Instance
from buun_tool.server.logfile import RotatingLog
from buun_tool.server.spec import LaunchSpec
from buun_tool.server.state import Record


class KeptFiles:
    def __init__(self, inst: Instance, log: RotatingLog, lock_fd: int | None):
        """`lock_fd`: the fd that holds the instance's lock, watched with its other files (watch)."""
        self.inst, self.log = inst, log
        self.lock_fd = lock_fd
        self.own_fds: list[int] = []  # locks taken again on a lock file made again (keep_lock)
        self.unsaved = False  # the last record could not be written (a full disk): written again later
        self.saved: tuple[int, ...] | None = None  # the record file as last written (file_key)

    def save(self, record: Record) -> None:
        """Write the record. A failed write (a full disk) must not end the supervision of a server
        that serves: it is said in the log and written again at the next watch. Meanwhile each
        attempt sets the old record's modification time, which a full disk allows: a record
        modified well after its own updated_at is one its supervisor could not write
        (record_lag.lag), and `buun status` says it is stale."""
        try:
            self.inst.write(record)
        except (OSError, BuunError) as exc:
            if not self.unsaved:
                self.log.event(f"could not write {self.inst.state_file} ({getattr(exc, 'message', exc)}); "
                               "`buun status` shows an older state until it can")
            self.unsaved = True
            try:  # a new time on the old record needs no free space: it tells `buun status` the record is behind
                os.utime(self.inst.state_file)
            except OSError:
                pass
            return
        self.unsaved, self.saved = False, file_key(self.inst.state_file)

    def watch(self, record: Record, spec: LaunchSpec) -> None:
        """Every supervise.WATCH_EVERY s: the instance's files are the ones this supervisor keeps.
        Deleted or damaged while it runs (its folder removed, the record cut short), they are made
        again: else `buun status` says the instance is stopped while it serves and `buun stop`
        cannot find it (until then, the guard keeps a second `buun start` of the name from
        running: instance.py)."""
        self.keep_lock()
        if self.unsaved or file_key(self.inst.state_file) != self.saved:
            self.save(record)
        if self.inst.read_spec() is None:  # `buun restart` relaunches from it
            try:
                self.inst.write_spec(spec.to_json())
            except (OSError, BuunError):
                pass

    def keep_lock(self) -> None:
        """The lock file is still the one we hold a lock on; if not, lock a new one."""
        if self.lock_fd is None:
            return
        mine = os.fstat(self.lock_fd)
        try:
            now = os.stat(self.inst.lock_file)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                return
        except FileNotFoundError:
            pass
        try:
            fd = self.inst.try_lock()
        except OSError:
            return  # the folder cannot be made now (a full disk): the next watch tries again
        if fd is None:
            self.log.event(f"{self.inst.lock_file} was replaced by another process's, which holds it: "
                           f"another instance named {self.inst.name} may run beside this one")
            self.lock_fd = None  # said once
            return
        self.own_fds.append(fd)
        self.lock_fd = fd
        self.log.event(f"{self.inst.lock_file} was deleted while running; made again")

    def close(self) -> None:
        """Let go of the locks taken again (the one passed in is its caller's to close)."""
        for fd in self.own_fds:
            os.close(fd)


def file_key(file: Path) -> tuple[int, ...] | None:
    """What tells a file from another, or from itself rewritten."""
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
