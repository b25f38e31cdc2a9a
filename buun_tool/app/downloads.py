"""What `buun setup` shows of the downloads while they run beside the build (side_by_side.py).

One rich live display is shown at a time, and while the build runs it is the build's own (its
progress bar, on a terminal). So meanwhile the build's lines go on as they are, and the download
says where it stands in one plain line now and then: every LINE_STEP of its bytes or every
LINE_EVERY_S seconds, with its speed and the time left. That is what a user waiting on both wants to
read (how far, how long), and it reads the same in a CI log or a pipe, where a live bar shows
nothing at all for the half hour a download takes; two bars redrawn by two lanes would garble each
other. Once the build is done and the download goes on, on a terminal pull's own bars (a line a
file, with its speed) take over, as when pull runs alone; without a terminal the lines go on. The
lines are text: no cursor moves, and no colours where there is no terminal.

The transfer runs in another process: there the same object only sends what happens to its tasks
(relay_to), and here it takes them in (mirror) and shows them.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from rich.progress import Progress, TaskID

from buun_tool.base import console
from buun_tool.pipeline import pull
from buun_tool.pipeline.pull_disk import gb

LINE_STEP = 0.10  # a progress line for every 10% of the bytes downloaded ...
LINE_EVERY_S = 60.0  # ... or every minute, whichever comes first


class Downloads(Progress):
    """The pull's progress (its `bar`) while it runs beside the build."""

    def __init__(self) -> None:
        super().__init__(*pull.bar_columns(), console=console.err, transient=True)
        self.total = 0  # the bytes of every file to fetch (pull's plans)
        self._conn: Connection | None = None  # in the downloads' process: where its events go
        self._ids: dict[int, TaskID] = {}  # the other process's task ids: this one's
        self._live = False
        self._moved = 0.0  # the bytes received in this run
        self._last = (time.monotonic(), 0.0, 0.0)  # when, bytes received and fraction done at the last line

    # --- in the downloads' process ----------------------------------------------------------

    def relay_to(self, conn: Connection) -> None:
        """From now on each event of the transfer goes over `conn`, to the Downloads of the parent."""
        self._conn = conn

    def _send(self, *event: Any) -> None:
        if self._conn is not None:
            self._conn.send(("progress", *event))

    def planned(self, plans: list[pull.RepoPlan]) -> None:
        """pull's on_plan: what the whole download is."""
        self.total = sum(f.size for p in plans for f in p.to_fetch)
        self._last = (time.monotonic(), 0.0, 0.0)
        self._send("total", self.total)

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task = super().add_task(description, *args, **kwargs)
        self._send("add", int(task), description, kwargs.get("total"), kwargs.get("completed", 0))
        return task

    def update(self, task_id: TaskID, *args: Any, **kwargs: Any) -> None:
        super().update(task_id, *args, **kwargs)
        self._send("update", int(task_id), kwargs.get("total"), kwargs.get("completed"))

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        """Each piece of a file that arrives."""
        super().advance(task_id, advance)
        self._moved += advance
        if self._conn is not None:
            self._send("advance", int(task_id), advance)
        elif not self._live:
            self._line()

    # --- here ----------------------------------------------------------------------------------

    def mirror(self, kind: str, *args: Any) -> None:
        """An event the downloads' process sent, applied to these tasks."""
        if kind == "total":
            self.total = args[0]
            self._last = (time.monotonic(), 0.0, 0.0)
        elif kind == "add":
            their, description, total, completed = args
            self._ids[their] = self.add_task(description, total=total, completed=completed)
        elif kind == "update":
            their, total, completed = args
            self.update(self._ids[their], **{k: v for k, v in (("total", total), ("completed", completed))
                                             if v is not None})
        elif kind == "advance":
            self.advance(self._ids[args[0]], args[1])

    def _line(self) -> None:
        now = time.monotonic()
        when, moved, shown = self._last
        done = sum(t.completed for t in self.tasks)  # resumed bytes count as done
        total = self.total or sum(t.total or 0 for t in self.tasks)
        if total <= 0:
            return
        fraction = min(done / total, 1.0)
        if fraction - shown < LINE_STEP and now - when < LINE_EVERY_S:
            return
        rate = max(self._moved - moved, 0.0) / max(now - when, 1e-3)
        left = f", about {_duration((total - done) / rate)} left" if rate > 0 and total - done >= rate else ""
        console.info(f"pull: {gb(int(done))} of {gb(total)} ({fraction:.0%}), {gb(int(rate))}/s{left}")
        self._last = (now, self._moved, fraction)

    def show_live(self) -> None:
        """The build is done: on a terminal, pull's own bars from now on (the lines stop)."""
        if console.err.is_terminal:
            self._live = True
            self.start()

    def hide(self) -> None:
        """The bars gone, if they were shown (rich's stop prints an empty line where they were not)."""
        if self._live:
            self.stop()


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
