"""HTTP probes of a running llama-server: /health, /slots, /props and /metrics.

Every probe has a short timeout and never raises: a result says what happened, so the loop
and `buun status` can tell "loading" from "refused" from "hung". Proxies from the environment
are ignored (the server is on this machine).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from buun_tool.server.metrics import count, figure

T = TypeVar("T")
MAX_BODY = 16 << 20  # /metrics, /slots and /props are KBs; a body past this is not theirs and is not read on
CUT_GRACE = 1.0  # seconds a call given up on has to end once its connections are cut


class TookTooLong(Exception):
    pass


class Session(requests.Session):
    """A requests session whose open connections another thread can cut (`cut`): a read blocked in
    one, even of the response's headers, returns at once. No proxy from the environment: the
    server is the one at the URL."""

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False
        self._conns: list[HTTPConnection] = []
        adapter = _Watched(self._conns)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def cut(self) -> None:
        for conn in list(self._conns):
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # closed (or wrapped in TLS) meanwhile
                    pass


class _Watched(HTTPAdapter):
    """An adapter whose pools list each connection they make in `conns` (those closed dropped)."""

    def __init__(self, conns: list[HTTPConnection]):
        self.conns = conns  # before HTTPAdapter's __init__, which makes the pool manager
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        conns = self.conns

        def watched(base: type[HTTPConnectionPool]) -> type[HTTPConnectionPool]:
            class Pool(base):  # type: ignore[valid-type, misc]
                def _new_conn(self) -> Any:
                    conn = super()._new_conn()
                    conns[:] = [c for c in conns if c.sock is not None]  # a long-lived probe's stay few
                    conns.append(conn)
                    return conn
            return Pool

        self.poolmanager.pool_classes_by_scheme = {"http": watched(HTTPConnectionPool),
                                                   "https": watched(HTTPSConnectionPool)}


def within(seconds: float, call: Callable[[threading.Event], T], session: Session) -> T:
    """call(stop) on a thread of its own, waited on for `seconds` at most: its result (or its
    exception, raised here); TookTooLong when it is not done by then, once `stop` is set and the
    connections of `session` (the one the call uses) are cut, so that the call ends then and
    holds no socket. requests' timeout is per read: a server that trickles its bytes (its
    headers too), or never ends its body, held a plain call forever, and a given-up call's
    thread and connection as long as the server went on."""
    stop, done = threading.Event(), {}

    def work() -> None:
        try:
            done["result"] = call(stop)
        except Exception as exc:
            done["error"] = exc

    worker = threading.Thread(target=work, name="buun-http", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        stop.set()
        session.cut()
        worker.join(CUT_GRACE)
        raise TookTooLong
    if "error" in done:
        raise done["error"]
    return done["result"]


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str  # "ok", "loading model", "connection refused", "timed out after 2 s", "HTTP 500"


class Probe:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._s = Session()
        if api_key:
            self._s.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self._s.close()

    def _get(self, path: str, timeout: float | None = None) -> tuple[int, bytes]:
        """The status and body of a GET, all of it within the timeout; a body over MAX_BODY is
        left unread (b"")."""
        seconds = timeout or self.timeout

        def fetch(stop: threading.Event) -> tuple[int, bytes]:
            with self._s.get(self.base_url + path, timeout=seconds, stream=True) as r:
                body = bytearray()
                for chunk in r.iter_content(65536):
                    body += chunk
                    if stop.is_set() or len(body) > MAX_BODY:
                        return r.status_code, b""
                return r.status_code, bytes(body)

        try:
            return within(seconds, fetch, self._s)
        except TookTooLong:
            raise requests.Timeout(f"{path}: no whole answer within {seconds:g} s") from None

    def health(self, timeout: float | None = None) -> Health:
        try:
            status, _ = self._get("/health", timeout)
        except requests.Timeout:
            return Health(False, f"timed out after {timeout or self.timeout:g} s")
        except requests.ConnectionError:
            return Health(False, "connection refused")
        except requests.RequestException as exc:
            return Health(False, type(exc).__name__)
        if status == 200:
            return Health(True, "ok")
        if status == 503:
            return Health(False, "loading model")
        return Health(False, f"HTTP {status}")

    def get_json(self, path: str) -> tuple[int, Any]:
        """(status, parsed body); status 0 when the server did not answer."""
        try:
            status, body = self._get(path)
        except requests.RequestException:
            return 0, None
        try:
            return status, json.loads(body)
        except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested past the stack
            return status, None

    def get_text(self, path: str) -> tuple[int, str]:
        try:
            status, body = self._get(path)
        except requests.RequestException:
            return 0, ""
        return status, body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SlotRow:
    """One slot of /slots, as `buun status` shows it: busy or idle, the tokens in its context, and
    its request's figures (the running request's, an idle slot's last)."""

    id: int | None
    busy: bool
    task: int | None  # None: the slot never ran a request
    context_tokens: int | None
    generated: int | None
    tokens_per_second: float | None
    drafted: int
    accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SlotsRow:
    """The server's slots: from /slots when it is enabled (each one's too, `per_slot`), else the
    total from /props (`per_slot` None); or why neither answered (`error`)."""

    total: int | None = None
    busy: int | None = None
    n_ctx: int | None = None
    source: str | None = None  # "/slots" or "/props"
    per_slot: tuple[SlotRow, ...] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """`buun status --json`'s `slots`."""
        if self.error:
            return {"error": self.error}
        out: dict[str, Any] = {"total": self.total, "busy": self.busy, "n_ctx": self.n_ctx, "source": self.source}
        if self.per_slot is not None:
            out["per_slot"] = [row.to_json() for row in self.per_slot]
        return out


NEEDS_KEY = "needs the API key (--api-key or BUUN_API_KEY)"


def slots_summary(probe: Probe) -> SlotsRow | None:
    """Slots from /slots when it is enabled (each one's too), else the total from /props."""
    status, body = probe.get_json("/slots")
    if status == 200 and isinstance(body, list):
        slots = [s for s in body if isinstance(s, dict)]
        return SlotsRow(total=len(body), busy=sum(1 for s in slots if s.get("is_processing")),
                        n_ctx=next((s.get("n_ctx") for s in slots if s.get("n_ctx")), None), source="/slots",
                        per_slot=tuple(slot_state(s) for s in slots))
    if status == 401:
        return SlotsRow(error=NEEDS_KEY)
    status, props = probe.get_json("/props")
    if status == 200 and isinstance(props, dict):
        gen = props.get("default_generation_settings")
        n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
        return SlotsRow(total=props.get("total_slots"), n_ctx=n_ctx, source="/props")
    if status == 401:
        return SlotsRow(error=NEEDS_KEY)
    return None


def slot_state(slot: dict[str, Any]) -> SlotRow:
    """One slot of /slots (`timings` is buun's patch 0026, absent upstream, when they stay None).
    With several slots /metrics sums them all: this is each user's own."""
    t = slot.get("timings")
    t = t if isinstance(t, dict) else {}
    drafted, accepted, steps = (count(t.get(k)) or 0 for k in ("draft_n", "draft_n_accepted", "draft_n_steps"))
    return SlotRow(
        id=slot.get("id"),
        busy=bool(slot.get("is_processing")),
        task=count(slot.get("id_task")),
        context_tokens=count(slot.get("n_prompt_tokens")),
        generated=count(t.get("predicted_n")),
        tokens_per_second=figure(t.get("predicted_per_second")) or None,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_acceptance_length=1 + accepted / steps if steps else None,
    )
