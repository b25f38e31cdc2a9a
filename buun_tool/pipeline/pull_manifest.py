"""Each pulled folder's `buun-manifest.json` and the checks of files against it: what was verified
(size, sha256, git blob id, and the size and mtime the file had then), and whether a file on disk
is still, or already, the one the Hub lists."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from buun_tool.pipeline.pull_hub import RemoteFile

MANIFEST = "buun-manifest.json"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def unchanged(path: Path, entry: dict[str, Any]) -> bool:
    """Whether a manifest entry's hashes still hold for `path`: the size and mtime it had when
    it was hashed. Any write (a flipped byte, a copy) changes the mtime."""
    st = path.stat()
    return entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns


def file_hashes(path: Path) -> tuple[str, str]:
    """sha256 of the content and its git blob id, in one pass."""
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def _matches(remote: RemoteFile, sha256: str | None, git_oid: str | None) -> bool:
    if remote.sha256:
        return sha256 == remote.sha256
    return remote.git_oid is None or git_oid == remote.git_oid


def local_entry(folder: Path, entry: dict[str, Any] | None, remote: RemoteFile, verify: bool) -> dict[str, Any] | None:
    """The manifest entry of the file on disk when it is the one the Hub has, else None.

    The manifest is trusted while the file keeps its recorded size and mtime; otherwise (or with
    `verify`) the file is hashed, which also adopts a correct file copied in by hand."""
    path = folder / remote.name
    if not path.is_file() or path.stat().st_size != remote.size:
        return None
    st = path.stat()
    if (entry and not verify and unchanged(path, entry)
            and _matches(remote, entry.get("sha256"), entry.get("git_oid"))):
        return entry
    sha256, git_oid = file_hashes(path)
    if not _matches(remote, sha256, git_oid):
        return None
    return {"size": remote.size, "sha256": sha256, "git_oid": git_oid, "lfs": remote.sha256 is not None,
            "mtime_ns": st.st_mtime_ns}
