"""Secrets on buun's own command line, masked where other users read it.

`buun serve --api-key KEY` runs for as long as the server does, and every user of the machine
reads a process's arguments (/proc/PID/cmdline: `ps`, `top`). buun hands the key on through the
environment (command.SECRET_ENV), which only its owner reads; `mask_secrets` rewrites this
process's own argument memory first thing on start, each secret value as `****` whatever its
length, so that they show only for the moment the interpreter takes to start. Python keeps its own
copy of the arguments (sys.argv), which the commands still parse. Linux only; elsewhere, or where
the kernel refuses the write, nothing changes (BUUN_API_KEY keeps a key off the command line).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from buun_tool.base.command import MASK, SECRET_FLAGS, canonical


def secret_spans(args: Sequence[bytes]) -> list[tuple[int, int, int]]:
    """(argument index, first byte, end byte) of each secret value among `args`: the argument after
    a secret flag in any spelling (`--api-key KEY`, `-- -hft TOKEN`), or the part after `=`
    (`--api-key=KEY`, `-hft=TOKEN`)."""
    spans = []
    for i, arg in enumerate(args):
        name, eq, _ = arg.partition(b"=")
        text = name.decode("utf-8", "replace")
        if eq and text.startswith("-") and canonical(text) in SECRET_FLAGS:
            spans.append((i, len(name) + 1, len(arg)))
        elif not eq and canonical(text) in SECRET_FLAGS and i + 1 < len(args):
            spans.append((i + 1, 0, len(args[i + 1])))
    return spans


def masked_title(raw: bytes) -> bytes | None:
    """The argument memory `raw` (/proc/PID/cmdline: each argument and its NUL) rewritten with every
    secret value as `****`, or None when it holds none. The memory keeps its size, so a value
    masked in place, or padded with NULs, would still tell its length (/proc/PID/cmdline gives
    every byte). Written instead as one line, the arguments joined by spaces and ended by a NUL, with
    a last byte that is not NUL: the kernel then reads it as a title set by setproctitle(3) and
    gives only the line, up to that NUL (ps and psutil split it at its spaces). A line longer than
    the memory (secrets of 4 bytes or fewer) loses its end."""
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    spans = secret_spans(args)
    if not spans:
        return None
    for i, first, _ in spans:
        args[i] = args[i][:first] + MASK.encode()
    line = b" ".join(args)[:len(raw) - 2]
    return line + b"\0" * (len(raw) - 1 - len(line)) + b"*"


def mask_secrets(proc: str = "/proc/self") -> bool:
    """Rewrite this process's command line (as /proc/PID/cmdline shows it) with its secret values
    masked (masked_title). False when it could not (not Linux, a kernel that refuses)."""
    try:
        with open(f"{proc}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after the command name: field 3 onwards
        arg_start, arg_end = int(fields[48 - 3]), int(fields[49 - 3])
        with open(f"{proc}/cmdline", "rb") as f:
            raw = f.read()
    except (OSError, ValueError, IndexError):
        return False
    if len(raw) != arg_end - arg_start:  # the arguments were moved (a setproctitle): not ours to write
        return False
    title = masked_title(raw)
    if title is None:
        return True
    try:
        with open(f"{proc}/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            mem.write(title)
    except OSError:
        return False
    return True


def without_password(url: str) -> str:
    """`url` with the password of its user part masked (a proxy's `http://user:pass@host`): bench.json,
    a manifest and error messages are shared."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:****@{host}"))
