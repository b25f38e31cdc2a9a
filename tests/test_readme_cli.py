"""The user docs' commands are the CLI's: every `buun ...` in README.md and the design docs names a
command that exists, with options that command takes. A renamed or removed option fails here, not
in a reader's shell. (docs/lab and docs/results are a journal of what ran then: not checked.)"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from buun_tool.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "patches" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(text: str) -> list[str]:
    """Each `buun WORD ...` of the text: inline code (wrapped over lines or not) and the lines of
    code blocks (a trailing backslash continues one), without a shell comment."""
    found = [" ".join(s.split()) for s in re.findall(r"`(buun [a-z][^`]*)`", text)]
    block, lines = False, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("```"):
            block = not block
        elif block and line.strip().startswith("buun ") and not (i and lines[i - 1].rstrip().endswith("\\")):
            cmd = line.strip()
            j = i
            while cmd.endswith("\\") and j + 1 < len(lines):
                j += 1
                cmd = cmd[:-1] + " " + lines[j].strip()
            found.append(" ".join(re.split(r"\s#", cmd)[0].split()))
    return found


def problems(cmd: str, root: Any) -> list[str]:
    """What in `cmd` the CLI does not have: a command, or an option of it. Words after `--` are
    llama-server's; `[--x]`, `A | B` and `...` are the docs' notation."""
    words = re.sub(r"[\[\]|]", " ", cmd).split()[1:]
    node, path = root, ["buun"]
    while words and hasattr(node, "commands") and words[0] in node.commands:
        node = node.commands[words.pop(0)]
        path.append(node.name)
    if node is root:
        return [f"{cmd}: no command {words[0]!r}" if words else f"{cmd}: no command"]
    options = {name: p for p in node.params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")}
    out = []
    while words:
        word = words.pop(0)
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d.*", word):
            continue
        name = word.split("=")[0].rstrip(",.:;)")
        param = options.get(name)
        if param is None:
            out.append(f"{cmd}: `{' '.join(path)}` has no option {name}")
        elif not getattr(param, "is_flag", False) and "=" not in word:
            del words[:max(param.nargs, 1)]  # its value(s), which may start with '-' (--drop -cd)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_documented_command_and_option_exists(doc: Path) -> None:
    root = typer.main.get_command(app)
    cmds = commands(doc.read_text())
    assert cmds or doc.name != "README.md"
    errors = [p for c in cmds for p in problems(c, root)]
    assert not errors, "\n".join(errors)


def test_the_check_finds_what_is_wrong() -> None:
    """The check itself: a command, an option, a value that looks like an option, notation."""
    root = typer.main.get_command(app)
    assert problems("buun serv --port 1", root) == ["buun serv --port 1: no command 'serv'"]
    assert problems("buun serve --prot 1", root) == ["buun serve --prot 1: `buun serve` has no option --prot"]
    assert problems("buun worker start --cache --wait", root) == []
    assert problems("buun serve --drop -cd --drop --jinja -- -c 4096 --bogus", root) == []
    assert problems("buun doctor [--json] [--cpu | --gpu]", root) == [
        "buun doctor [--json] [--cpu | --gpu]: `buun doctor` has no option --gpu"]
    assert commands("```sh\nbuun fit --gpu-mem 24  # a note\nbuun bench --suite code \\\n  --mode raw\n```\n"
                    "and `buun restart NAME\n--models-dir Y`.") == [
        "buun restart NAME --models-dir Y", "buun fit --gpu-mem 24", "buun bench --suite code --mode raw"]


def test_every_help_paragraph_is_one_line_for_the_terminal_to_wrap() -> None:
    """typer's help kept a docstring's line breaks after its first paragraph: `buun build --help`
    broke "... without buun's patches," off its line on an 80-column terminal."""
    root = typer.main.get_command(app)

    def walk(node: Any, path: list[str]) -> list[tuple[list[str], Any]]:
        found = [(path, node)] if path else []
        for name, sub in getattr(node, "commands", {}).items():
            found += walk(sub, [*path, name])
        return found

    checked = 0
    for path, cmd in walk(root, []):
        paragraphs = inspect.cleandoc(cmd.help or "").split("\n\n")[1:]
        if not paragraphs:
            continue
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"}).stdout
        for p in paragraphs:
            line = " ".join(p.split())
            assert line in out, f"buun {' '.join(path)} --help: {line!r} is not one line of\n{out}"
            checked += 1
    assert checked >= 5
