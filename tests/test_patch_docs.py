"""Each patch is described once, in its header, under fixed labels; patches/README.md carries the
same words (written by `buun patch export`). Checked without a build: the README agrees with the
headers, every label is there, the series reads exactly the environment switches of
`patches.SWITCHES` (at most 8), each named by the patch that reads it, and what "Guarded by" names
exists (a test in tests/, a part of the GPU harness)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from buun_tool.base.errors import BuunError
from buun_tool.pipeline import patch_docs, patches

ROOT = Path(__file__).resolve().parent.parent
TEST_REF = re.compile(r"`(tests/test_\w+\.py)::(\w+)`")
HARNESS_REF = re.compile(r"`scripts/gpu_run\.sh ([\w-]+)`")
GETENV = re.compile(r"^\+.*getenv\(\"(\w+)\"\)", re.M)


def _series() -> list[Path]:
    return [p.path for p in patches.series(ROOT / "patches")]


def guard_problems(name: str, guard: str, root: Path) -> list[str]:
    """What is wrong with a patch's "Guarded by": it must name a test that exists or a part of the
    GPU harness (scripts/gpu_run.sh) that exists."""
    tests, parts = TEST_REF.findall(guard), HARNESS_REF.findall(guard)
    if not tests and not parts:
        return [f"{name}: Guarded by names no test (`tests/test_x.py::test_y`) and no harness part: {guard}"]
    errs = []
    for path, test in tests:
        f = root / path
        if not f.is_file() or not re.search(rf"^\s*(?:async )?def {test}\(|^class {test}\b", f.read_text(), re.M):
            errs.append(f"{name}: Guarded by {path}::{test}, which does not exist")
    harness = (root / "scripts" / "gpu_run.sh").read_text()
    for part in parts:
        if not re.search(rf"^part_{part.replace('-', '_')}\(\)", harness, re.M):
            errs.append(f"{name}: Guarded by scripts/gpu_run.sh {part}, a part the harness does not have")
    return errs


def test_the_readme_says_what_the_headers_say() -> None:
    readme = (ROOT / "patches" / "README.md").read_text()
    assert patch_docs.written(readme) == patch_docs.render(_series()), \
        "patches/README.md and the headers disagree: edit the header, then `buun patch export`"


def test_every_header_has_every_label_and_a_short_name() -> None:
    series = _series()
    assert len(series) > 0
    assert patch_docs.problems(series) == []
    for p in series:
        assert len(p.name) <= 50, f"{p.name}: a file name names the concern in a few words"


def test_the_series_reads_exactly_the_switches_it_documents() -> None:
    assert len(patches.SWITCHES) <= 8
    read = {}
    for p in _series():
        for var in GETENV.findall(p.read_text()):
            read[var] = p.name
    assert set(read) == set(patches.SWITCHES), "a switch the series reads and patches.SWITCHES differ"
    for var, name in read.items():
        _, fields = patch_docs.header(ROOT / "patches" / name)
        assert re.search(rf"\b{var}\b", fields["Switch"]), f"{name} reads {var}; its Switch must say why"
    for p in _series():
        _, fields = patch_docs.header(p)
        if not fields["Switch"].startswith("none"):
            assert read.get(next(iter(re.findall(r"\b[A-Z][A-Z0-9_]{5,}\b", fields["Switch"])), "")) == p.name, \
                f"{p.name}: its Switch names a variable it does not read"


def test_what_guards_each_patch_exists() -> None:
    errs = []
    for p in _series():
        errs += guard_problems(p.name, patch_docs.header(p)[1]["Guarded by"], ROOT)
    assert errs == []


def test_a_wrong_description_is_caught(tmp_path: Path) -> None:
    """The checks above fail on a README edited by hand, a header without a label, a guard that
    names no test or a missing one."""
    readme = (ROOT / "patches" / "README.md").read_text()
    series = _series()
    edited = readme.replace("- **What**: ", "- **What**: (edited) ", 1)
    assert patch_docs.written(edited) != patch_docs.render(series)
    with pytest.raises(BuunError, match="markers"):
        patch_docs.written(readme.replace(patch_docs.END, ""))

    text = series[0].read_text()
    broken = tmp_path / series[0].name
    broken.write_text(re.sub(r"\nUpstream: [^\n]*\n", "\n", text, count=1))
    assert patch_docs.problems([broken]) == [f"{broken.name}: its header has no 'Upstream:' paragraph"]

    assert guard_problems("x", "none", ROOT)
    assert guard_problems("x", "`tests/test_correctness.py::test_no_such_test`", ROOT)
    assert guard_problems("x", "`scripts/gpu_run.sh no-such-part`", ROOT)
    assert guard_problems("x", "`tests/test_patch_docs.py::test_a_wrong_description_is_caught`", ROOT) == []
