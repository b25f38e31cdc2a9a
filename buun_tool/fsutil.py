"""File helpers every stage needs the same way: hashing and crash-safe JSON records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from buun_tool.errors import DISK_FULL, disk_full


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old content or the new one, never half of it; on any
    failure (a full disk, Ctrl-C) the temporary file is removed and the old content stays."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise disk_full(exc, f"write {path}") from exc
        raise
