"""Shared fixtures: every test runs with its own XDG folders; the llama.cpp CPU build of the
checkout (made once by .ci/run or `make build`) serves the tests that run real binaries."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from buun_tool.pipeline import build

# fixture modules shared by several test files (tests/support/__init__.py says what each is for)
pytest_plugins = ["tests.support.fake_gpus", "tests.support.fake_llama_source", "tests.support.fixtures_models",
                  "tests.support.fixtures_server", "tests.support.fixtures_upstream_build",
                  "tests.support.lock_holder"]


# Fixtures that need the llama.cpp build: a test that uses one (directly or through another fixture)
# runs real binaries, so it belongs to the full tier, never to `make check`.
NEEDS_BUILD = {"llama_bin", "upstream_build_dir"}


def pytest_configure(config: pytest.Config) -> None:
    # Started in the background by a non-interactive shell (`nohup make test &`), pytest inherits an
    # ignored SIGINT, and so would every child it starts (an ignored disposition survives exec): the
    # tests that send Ctrl-C to buun would wait for an exit that never comes. A handler of our own is
    # reset to the default at each child's exec, so children get SIGINT as from a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # A blocked signal stays blocked through an exec too, and Python unblocks none: the signals the
    # tests send would wait, pending, for ever. (test_interrupt checks what a child gets.)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if NEEDS_BUILD & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the user's real ~/.local/share/buun, ~/.cache/buun, ..."""
    home = tmp_path / "buun-home"
    for var, sub in (("BUUN_DATA_DIR", "data"), ("BUUN_STATE_DIR", "state"), ("BUUN_CONFIG_DIR", "config"),
                     ("BUUN_MODELS_DIR", "data/models")):
        monkeypatch.setenv(var, str(home / sub))
    # the sdist and converter environment are expensive: shared between tests, not with the user
    monkeypatch.setenv("BUUN_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "buun-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    """The folder of the CPU build's binaries. Fails (never skips) when the build is missing:
    .ci/run builds it before pytest, locally `make build` does."""
    try:
        return build.bin_dir()
    except Exception as exc:  # NotReadyError: say how to get it
        pytest.fail(f"llama.cpp is not built: {exc}. Run `make build` first.")
