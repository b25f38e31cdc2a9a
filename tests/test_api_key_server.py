"""The API key as the CPU build's llama-server reads it, a real server on the tiny target: the keys
it takes from LLAMA_API_KEY (where buun hands it the key) are those command.csv_keys gives, so the
launch check (command.api_keys) judges the key that will be served; and at trace level its log shows
no part of a key (patch 0029)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from buun_tool.base import command
from tests.support.real_llama_server import Server, llama_server


def _status(server: Server, key: str | None) -> int:
    """HTTP status of a request that needs the key (/v1/models; /health needs none)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.get(f"{server.url}/v1/models", headers=headers, timeout=30).status_code


def _args(tiny_pair: tuple[Path, Path], *extra: str) -> list[str]:
    return ["-m", str(tiny_pair[0]), "-np", "1", "-c", "256", *extra]


@pytest.mark.parametrize(("given", "keys"), [
    # no key at all: the server is open to whoever reaches it, which buun now refuses
    (",", []),
    ('"",,', []),
    # a quoted part keeps its comma; the empty parts go
    ('"a,b",,c', ["a,b", "c"]),
])
def test_llama_server_reads_the_keys_buun_judges(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, given: str, keys: list[str]) -> None:
    assert command.csv_keys(given) == keys
    monkeypatch.setenv(command.API_KEY_ENV, given)
    with llama_server(llama_bin, _args(tiny_pair), tmp_path / "server.log") as server:
        if not keys:
            assert _status(server, None) == 200, server.log_tail()
        else:
            assert _status(server, None) == 401 and _status(server, given) == 401
            assert [_status(server, k) for k in keys] == [200] * len(keys)


def test_the_trace_log_shows_no_part_of_the_key(llama_bin: Path, tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At trace level (-lv 4) llama-server logged a single key's last 4 characters; buun writes the
    server's log to the instance's log file (`buun logs`). Patch 0029 logs how many keys there are."""
    key = "QWZX-vkjy-PLMQ-hgfw"  # no hex: none of its parts turns up in a log by chance
    monkeypatch.setenv(command.API_KEY_ENV, key)
    log = tmp_path / "server.log"
    with llama_server(llama_bin, _args(tiny_pair, "-lv", "4"), log) as server:
        assert _status(server, key) == 200 and _status(server, None) == 401
    text = log.read_text(errors="replace")
    assert "api_keys: 1 key loaded" in text  # the line that showed `****hgfw`, at the level it is logged
    assert not [key[i:i + 4] for i in range(len(key) - 3) if key[i:i + 4] in text]
