"""Every relative link of the docs leads somewhere: the file exists and, where the link names a
heading (`page.md#anchor`), the page has that heading. Docs are moved and split as the product
grows; a link left behind fails here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "recipes" / "README.md", ROOT / "patches" / "README.md",
         ROOT / "tests" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#") and not target[1:]:
            continue  # a URL, or an empty anchor
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return out


def test_every_relative_link_of_the_docs_resolves() -> None:
    pages = [p for p in PAGES if p.exists()]
    assert len(pages) > 10
    assert [b for page in pages for b in broken(page)] == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Some part\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#some-part) [file](gone.md) [heading](a.md#other) [web](https://x.org/y)\n")
    found = [b.split(": ", 1)[1] for b in broken(page, tmp_path)]
    assert found == ["gone.md (no such file)", "a.md#other (no such heading)"]

