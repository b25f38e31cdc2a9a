"""Headless Chromium driven through the Chrome DevTools protocol over --remote-debugging-pipe:
no driver, no npm package, no websocket library. Chromium reads commands on fd 3 and writes
replies on fd 4, each a JSON message ended by a NUL byte.

Debian's package: `apt-get install -y chromium`.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900")

# Puts the two pipe ends on fds 3 and 4, where Chromium expects them, then becomes Chromium.
_WRAPPER = ("import os, sys; a, b = os.dup(int(sys.argv[1])), os.dup(int(sys.argv[2])); "
            "os.dup2(a, 3); os.dup2(b, 4); os.set_inheritable(3, True); os.set_inheritable(4, True); "
            "os.execv(sys.argv[3], sys.argv[3:])")


def find_chromium() -> str | None:
    return next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser"))
                 if p and os.access(p, os.X_OK)), None)


class CdpError(RuntimeError):
    pass


class Chromium:
    def __init__(self, binary: str, profile: Path, log: Path):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WRAPPER, str(cmd_r), str(res_w), binary, *FLAGS,
                 f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
                pass_fds=(cmd_r, res_w), stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        os.close(cmd_r)
        os.close(res_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None
        self.events: list[dict[str, Any]] = []  # what Chromium reported between replies, in order

    def close(self) -> None:
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def _read_message(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._res_r], [], [], left)[0]:
                raise CdpError(f"no reply from Chromium within {timeout:g} s")
            chunk = os.read(self._res_r, 1 << 20)
            if not chunk:
                raise CdpError("Chromium closed the debugging pipe (did it crash? see its log)")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30,
             browser: bool = False) -> dict[str, Any]:
        """Send a command (to the page's session unless `browser`) and return its result."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(max(deadline - time.monotonic(), 0.01))
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def open_page(self, url: str, watch: bool = False) -> None:
        """Open url in a new tab; with `watch`, its requests and log entries are recorded from the
        start (console_errors, requests)."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 browser=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        if watch:
            self.call("Network.enable")
            self.call("Log.enable")
        self.call("Page.navigate", {"url": url})

    def console_errors(self) -> list[str]:
        """console.error/assert calls, uncaught exceptions and the browser's own error log entries
        (a resource that failed to load, a blocked request) seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Runtime.exceptionThrown":
                details = p.get("exceptionDetails", {})
                out.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        """The URLs the page requested so far (open_page with watch), data: URLs included."""
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def js(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise CdpError(f"{expression!r}: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.2)
        raise CdpError(f"timed out after {timeout:g} s waiting for {what}")

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def press_enter(self) -> None:
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **key})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **key})

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
