"""The supervisor's signals: SIGTERM and SIGINT ask its loop to stop, SIGHUP to relaunch the
server (or to stop, when it is a closed terminal's). The handlers only ask: the loop acts."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any


def install(request_stop: Callable[..., None], request_restart: Callable[[], None]) -> dict[int, Any]:
    """The handlers, on the main thread only (elsewhere Python refuses them); the ones they replace."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old = {}
    ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]

    def hangup() -> None:
        """SIGHUP is `buun restart`'s (and systemd's reload), but a terminal that closes sends
        it too, to `buun serve` in it: then stop, as any program in a closed terminal does,
        rather than relaunch llama-server for no one and die at the first line it shows."""
        if ttys and not all(os.isatty(fd) for fd in ttys):  # a hung-up terminal is no tty
            request_stop("the terminal closed")
        else:
            request_restart()

    for sig, action in ((signal.SIGTERM, request_stop), (signal.SIGINT, request_stop),
                        (signal.SIGHUP, hangup)):
        old[sig] = signal.signal(sig, lambda _s, _f, a=action: a())
    return old


def restore(old: dict[int, Any]) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)
