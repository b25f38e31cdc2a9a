"""RPC workers' addresses: `--rpc HOST:PORT,...` parsed and checked, and what to do about one that
does not answer. No I/O but name resolution: rpc.py probes and places, loglines.py names a lost
worker's next step, and both read the addresses here.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from buun_tool.base.errors import UsageError

DEFAULT_PORT = 50052  # ggml-rpc-server's own default

# ggml-rpc takes the host up to the first ':' and connects over IPv4 only (gethostbyname)
_ENDPOINT = re.compile(r"(?P<host>[^:\s\[\]]+):(?P<port>\d+)")
USAGE_HINT = "--rpc HOST:PORT[,HOST:PORT...] (a name or an IPv4 address), e.g. --rpc 10.0.0.5:50052,10.0.0.6:50052"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse(text: str) -> list[Endpoint]:
    """`host:port,host:port` as endpoints, in order; each once. No IPv6: llama.cpp's RPC has none."""
    out: list[Endpoint] = []
    seen: dict[tuple[str, int], Endpoint] = {}
    for item in (t.strip() for t in text.split(",")):
        m = _ENDPOINT.fullmatch(item)
        if not m:
            raise UsageError(f"--rpc {text!r}: {item!r} is not HOST:PORT", USAGE_HINT)
        host, port = m["host"], int(m["port"])
        if not 0 < port < 65536:
            raise UsageError(f"--rpc {text!r}: port {port} is not in 1..65535", USAGE_HINT)
        ep = Endpoint(host, port)
        # one worker named twice, in any spelling: llama-server would quietly use an exact repeat
        # once, and connect twice to one spelt otherwise (a second device that waits in its queue)
        first = seen.setdefault((_host_key(host), port), ep)
        if first is not ep:
            again = f" (again as {ep})" if str(ep) != str(first) else ""
            raise UsageError(f"--rpc {text!r} names {first} twice{again}", "name each worker once")
        out.append(ep)
    return out


def _host_key(host: str) -> str:
    """One spelling of a host as ggml-rpc's gethostbyname reads it: a name in any case, an IPv4
    address in any form inet_aton takes (127.1, 0x7f.0.0.1)."""
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return host.lower()


def check_distinct(endpoints: Sequence[Endpoint]) -> None:
    """No two endpoints are one worker by their address (localhost:P and 127.0.0.1:P), which
    parse cannot tell without resolving names; a name that does not resolve is left to the probe."""
    seen: dict[tuple[str, int], Endpoint] = {}
    for ep in endpoints:
        try:
            addr = socket.gethostbyname(ep.host)  # IPv4, as llama-server connects
        except OSError:
            continue
        first = seen.setdefault((addr, ep.port), ep)
        if first is not ep:
            raise UsageError(f"--rpc {join(endpoints)}: {first} and {ep} are one worker ({addr}:{ep.port})",
                             "name each worker once")


def join(endpoints: Sequence[Endpoint | str]) -> str:
    return ",".join(str(e) for e in endpoints)


def next_step(worker: str) -> str:
    """What to do about a worker that does not answer."""
    ep = parse(worker)[0]
    start = f"buun worker start --port {ep.port}"
    if is_loopback(ep.host):
        return (f"start it (`{start}`), or, if {worker} is an SSH tunnel, open it again "
                f"(`ssh -N -L {ep.port}:127.0.0.1:{ep.port} user@worker`)")
    return f"run `{start} --host {ep.host}` on that machine, or open the SSH tunnel"


def is_loopback(host: str) -> bool:
    return host == "localhost" or _ip(host) is not None and _ip(host).is_loopback  # type: ignore[union-attr]


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
