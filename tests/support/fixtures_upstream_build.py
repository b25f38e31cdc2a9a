"""The unpatched pin's CPU build for the tests of `buun bench --against upstream` (a pytest plugin).

`upstream_build_dir` is a build folder (BUUN_BUILD_DIR) holding the checkout's CPU build, linked
and only read, and the upstream CPU build beside it, made by build.build as `buun build --upstream
--cpu` makes it. It lives in .pytest_cache, never in the checkout's build folder, and its stamp
makes the next session's build a no-op: the minutes of compiling are paid once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buun_tool.base import paths
from buun_tool.pipeline import build

FOLDER = Path(__file__).resolve().parents[2] / ".pytest_cache" / "buun-build-upstream"


def build_upstream(folder: Path = FOLDER) -> Path:
    """The build folder with both builds; builds the upstream one when its stamp is not current."""
    patched = paths.build_dir("cpu").resolve()  # the checkout's build, before BUUN_BUILD_DIR moves
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "cpu"
    if not link.is_symlink() or link.resolve() != patched:
        link.unlink(missing_ok=True)
        link.symlink_to(patched, target_is_directory=True)
    old = os.environ.get("BUUN_BUILD_DIR")
    os.environ["BUUN_BUILD_DIR"] = str(folder)
    try:
        # ui none: the web UI would need npm and its packages, and bench never loads it
        build.build(build.plan(cpu=True, ui="none").for_upstream())
    finally:
        if old is None:
            del os.environ["BUUN_BUILD_DIR"]
        else:
            os.environ["BUUN_BUILD_DIR"] = old
    return folder


@pytest.fixture(scope="session")
def upstream_build_dir(llama_bin: Path) -> Path:
    return build_upstream()


# warm the cache ahead of a test run: python -m tests.support.fixtures_upstream_build
if __name__ == "__main__":
    print(build_upstream())
