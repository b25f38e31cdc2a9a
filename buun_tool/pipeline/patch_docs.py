"""The series' description in patches/README.md, written from the patches' headers.

Each patch's commit message is its header: a subject naming its concern, then paragraphs under
fixed labels. patches/README.md carries the same fields as a table and a section a patch, between
two markers; `buun patch export` rewrites that part, so the two never disagree and a patch is
described in one place (its header).
"""

from __future__ import annotations

import email
import re
from email import policy
from email.message import Message
from pathlib import Path

from buun_tool.base.errors import BuunError

LABELS = ("What", "Why", "Provenance", "Upstream", "Switch", "Guarded by", "Drop when")
BEGIN = "<!-- the series, written by `buun patch export` from the patches' headers: edit the headers -->"
END = "<!-- end of the series -->"
_LABEL = re.compile(rf"^({'|'.join(LABELS)}): ", re.M)


def _subject(msg: Message) -> str:
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(msg.get("Subject", ""))).strip()


def subject(patch: Path) -> str:
    """A patch file's subject, without git's [PATCH] prefix."""
    return _subject(email.message_from_bytes(patch.read_bytes(), policy=policy.default))


def header(patch: Path) -> tuple[str, dict[str, str]]:
    """A patch file's subject and its labelled fields (each one paragraph, unwrapped)."""
    msg = email.message_from_bytes(patch.read_bytes(), policy=policy.default)
    subject = _subject(msg)
    body = msg.get_payload(decode=True).decode("utf-8", "replace").split("\n---\n")[0].split("\ndiff --git ")[0]
    fields: dict[str, str] = {}
    for para in re.split(r"\n\s*\n", body):
        m = _LABEL.match(para.strip())
        if m:
            fields[m.group(1)] = " ".join(para.strip()[m.end():].split())
    return subject, fields


def problems(patches: list[Path]) -> list[str]:
    """Headers that miss a label or hold it empty."""
    errs = []
    for p in patches:
        _, fields = header(p)
        errs += [f"{p.name}: its header has no '{label}:' paragraph" for label in LABELS if not fields.get(label)]
    return errs


def render(patches: list[Path]) -> str:
    """The README's part between the markers: a table of the series, then a section a patch."""
    rows = ["| patch | concern | switch |", "|---|---|---|"]
    sections = []
    for p in patches:
        subject, fields = header(p)
        switch = fields.get("Switch", "")
        rows.append(f"| [{p.name[:4]}](#{p.name[:4]}) | {subject} | {'yes' if not switch.startswith('none') else ''} |")
        sections.append("\n".join([f"### {p.name[:4]}", "", f"`{p.name}`: {subject}", "",
                                   *(f"- **{label}**: {fields.get(label, '')}" for label in LABELS)]))
    return "\n".join([BEGIN, "", *rows, "", "\n\n".join(sections), "", END])


def written(readme: str) -> str:
    """The part of `readme` between the markers, markers included."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise BuunError("patches/README.md lacks the markers around the series' description",
                        f"put the lines\n  {BEGIN}\n  {END}\nwhere the table and the sections belong")
    return readme[start:end + len(END)]


def rewrite(readme: Path, patches: list[Path]) -> None:
    """Write the series' description into `readme` between its markers."""
    text = readme.read_text()
    readme.write_text(text.replace(written(text), render(patches)))
