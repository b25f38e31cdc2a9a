"""patches/README.md describes every patch of the series under fixed labels, without a build: a
section per patch file with What / Why / Switch / Guarded by / Drop when, the switches of
`patches.SWITCHES` each named in the section of a patch whose file mentions it, and the tests
named under "Guarded by" present in tests/."""

from __future__ import annotations

import re
from pathlib import Path

from buun_tool.pipeline import patches

ROOT = Path(__file__).resolve().parent.parent
LABELS = ("What", "Why", "Switch", "Guarded by", "Drop when")
SECTION = re.compile(r"^### (\d{4}) `([^`]+)`[ \t]*$", re.M)
LABEL = re.compile(r"^- \*\*(.+?)\*\*:[ \t]*(.*)$", re.M)
TEST_REF = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")


def sections(readme: str) -> dict[str, tuple[str, str]]:
    """{patch file name: (its number in the heading, the section's text)}."""
    heads = list(SECTION.finditer(readme))
    out = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(readme)
        body = readme[m.end():end].split("\n## ", 1)[0]  # a section ends at the next heading of level 2
        out[m.group(2)] = (m.group(1), body)
    return out


def labels(body: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for m in LABEL.finditer(body):
        found.setdefault(m.group(1), []).append(m.group(2).strip())
    return found


def problems(readme: str, patch_dir: Path, root: Path, switches: tuple[str, ...]) -> list[str]:
    """Everything wrong with `readme` as the description of the series in `patch_dir`."""
    errs: list[str] = []
    files = {p.name: p.read_text(errors="replace") for p in sorted(patch_dir.glob("*.patch"))
             if patches.PATCH_RE.match(p.name)}
    secs = sections(readme)
    for name in files:
        if name not in secs:
            errs.append(f"{name}: no section `### {name[:4]} `{name}`` in patches/README.md")
        if not re.search(rf"^\| {name[:4]} \|", readme, re.M):
            errs.append(f"{name}: not in the table")
    values: dict[str, dict[str, str]] = {}
    for name, (number, body) in secs.items():
        if name not in files:
            errs.append(f"section {number} names {name}, which is not a patch in patches/")
            continue
        if number != name[:4]:
            errs.append(f"section {number} names {name}")
        got = labels(body)
        for label in LABELS:
            if len(got.get(label, [])) != 1 or not got[label][0]:
                errs.append(f"{name}: needs exactly one non-empty **{label}**, has {got.get(label, [])}")
        values[name] = {label: got.get(label, [""])[0] for label in LABELS}
        for label in got:
            if label not in LABELS:
                errs.append(f"{name}: unknown label **{label}**")

    # switches: each named under Switch, and only in sections of patches whose file mentions it
    for switch in switches:
        named = [n for n, v in values.items() if re.search(rf"\b{switch}\b", v["Switch"])]
        if not named:
            errs.append(f"{switch} (patches.SWITCHES) is the Switch of no section")
        for n in named:
            if not re.search(rf"\b{switch}\b", files[n]):
                errs.append(f"{n}: Switch names {switch}, which the patch does not mention")
    for n, v in values.items():
        if v["Switch"] and not v["Switch"].startswith("none") \
                and not any(re.search(rf"\b{s}\b", v["Switch"]) for s in switches):
            errs.append(f"{n}: Switch is neither 'none' nor a variable of patches.SWITCHES: {v['Switch']}")

    # guarded by: "none" or tests that exist
    for n, v in values.items():
        guard = v["Guarded by"]
        refs = TEST_REF.findall(guard)
        if not guard.startswith("none") and not refs:
            errs.append(f"{n}: Guarded by is neither 'none' nor `tests/test_x.py::test_name`: {guard}")
        for path, test in refs:
            f = root / path
            if not f.is_file():
                errs.append(f"{n}: Guarded by {path}, which does not exist")
            elif not re.search(rf"^\s*def {test}\(", f.read_text(), re.M):
                errs.append(f"{n}: Guarded by {path}::{test}, which {path} does not define")
    return errs


def _real() -> tuple[str, Path]:
    return (ROOT / "patches" / "README.md").read_text(), ROOT / "patches"


def test_every_patch_is_described_under_the_fixed_labels() -> None:
    readme, patch_dir = _real()
    errs = problems(readme, patch_dir, ROOT, patches.SWITCHES)
    assert not errs, "\n".join(errs)
    assert len(sections(readme)) == len(patches.series(patch_dir)) > 0


def test_a_missing_section_or_a_wrong_switch_is_caught() -> None:
    readme, patch_dir = _real()
    secs = list(SECTION.finditer(readme))
    first, second = secs[0], secs[1]
    without_first = readme[:first.start()] + readme[second.start():]
    errs = problems(without_first, patch_dir, ROOT, patches.SWITCHES)
    assert any(first.group(2) in e and "no section" in e for e in errs), errs

    # a switch moved to a patch whose file does not mention it, and a test that does not exist
    broken = readme.replace("- **Switch**: `LLAMA_SAMPLING_GREEDY=0`", "- **Switch**: none", 1)
    broken = broken.replace("- **Switch**: none", "- **Switch**: `LLAMA_SAMPLING_GREEDY=0`", 1)
    broken = broken.replace("::test_tape_replay_equals_snapshots`", "::test_no_such_test`", 1)
    errs = problems(broken, patch_dir, ROOT, patches.SWITCHES)
    assert any("Switch names LLAMA_SAMPLING_GREEDY" in e for e in errs), errs
    assert any("test_no_such_test" in e for e in errs), errs
