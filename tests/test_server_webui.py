"""The built-in web chat answers at the server's root URL: headless Chromium opens it, sends a
message and sees the reply. The screenshot is kept in test-artifacts/ (git-ignored).
Needs Debian's chromium (`apt-get install -y chromium`); a build without the UI fails, never skips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from buun_tool.server.process import free_port
from tests.support.chromium import Chromium, find_chromium
from tests.support.fixtures_server import ROOT, TEST_FLAGS, Buun

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "test-artifacts"


def require_ui_in_build(llama_bin: Path) -> None:
    stamp = llama_bin.parent / "buun-build.json"
    if stamp.is_file():
        ui = json.loads(stamp.read_text()).get("ui")
        if ui == "none":
            pytest.fail(f"this llama.cpp build has no web UI ({stamp}: \"ui\": \"none\"): install npm "
                        "(or allow the prebuilt download) and run `buun build --force`")


def test_web_chat_sends_a_message_and_shows_the_reply(buun: Buun, llama_bin: Path, tmp_path: Path) -> None:
    require_ui_in_build(llama_bin)
    chromium = find_chromium()
    if chromium is None:
        pytest.fail("Chromium is not installed: apt-get install -y chromium")
    port = free_port()
    buun.start("web", port, extra=TEST_FLAGS)
    url = f"http://127.0.0.1:{port}/"
    s = requests.Session()
    s.trust_env = False
    root = s.get(url, headers={"Accept-Encoding": "gzip"}, timeout=10)
    if root.status_code != 200 or "text/html" not in root.headers.get("Content-Type", ""):
        pytest.fail(f"no web UI at {url} (HTTP {root.status_code}, {root.headers.get('Content-Type')}): "
                    "this llama-server was built without it; run `buun build --force` with npm installed")

    browser = Chromium(chromium, tmp_path / "profile", tmp_path / "chromium.log")
    shot = ARTIFACTS / "webui-chat.png"
    shot.unlink(missing_ok=True)
    try:
        browser.open_page(url)
        browser.wait_for("!!document.querySelector('textarea')", 60, "the chat input")
        browser.js("document.querySelector('textarea').focus()")
        browser.type_text("Hello from buun")
        browser.press_enter()
        browser.wait_for("[...document.querySelectorAll('*')].some(e => e.children.length === 0 && "
                         "e.textContent.trim() === 'Hello from buun')", 30, "the user message")
        reply = browser.wait_for(
            "(document.querySelector('.chat-message-assistant .markdown-content') || {}).innerText", 60,
            "the assistant's reply")
        browser.screenshot(shot)
    except Exception:
        if browser.proc.poll() is None:
            try:
                browser.screenshot(ARTIFACTS / "webui-chat-failure.png")
            except Exception:
                pass
        raise
    finally:
        browser.close()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)
    assert reply.strip()
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    buun("stop", "web", check=True)
