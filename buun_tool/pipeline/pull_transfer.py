"""The pull stage's transfer: each file the plan lacks streamed into its partial file (resumed
from where it stopped, never past its announced size), checked against the Hub's listing, moved
into place and recorded in the folder's manifest.

huggingface_hub's own `hf_hub_download` is not used for the transfer: since 1.x it deletes a
partial file when a download fails, so a 16 GB target would restart from zero after Ctrl-C.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from huggingface_hub import get_hf_file_metadata
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from rich.progress import Progress

from buun_tool.base.errors import BuunError, Exit
from buun_tool.base.fsutil import write_json_atomic
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline.pull_disk import PARTIAL_DIR, partial_path
from buun_tool.pipeline.pull_hub import NETWORK_ERRORS, RemoteFile, hub_endpoint, hub_error, resolve_url, shown_endpoint
from buun_tool.pipeline.pull_manifest import MANIFEST, file_hashes, read_manifest
from buun_tool.pipeline.pull_plan import RepoPlan


def _progress_class(bar: Progress, task: Any) -> type:
    """A tqdm stand-in for huggingface_hub's `http_get` that moves one rich progress task."""

    class _Bar:
        def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any):
            bar.update(task, total=total, completed=initial)

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def update(self, n: int = 1) -> None:
            bar.advance(task, n)

    return _Bar


class _Oversized(Exception):
    """The server sent more than the file's announced size (not an OSError: no retry, no resume)."""


class _Capped:
    """The partial file as http_get writes it, refusing bytes beyond the announced size: a Hub
    that sends more would otherwise fill the disk before the size check at the end."""

    def __init__(self, fh: Any, size: int):
        self.fh, self.size = fh, size

    def write(self, chunk: bytes) -> int:
        if self.fh.tell() + len(chunk) > self.size:  # the position: http_get may rewind and start over
            raise _Oversized
        return self.fh.write(chunk)

    def __getattr__(self, name: str) -> Any:  # tell, seek, truncate: http_get rewinds on a 200
        return getattr(self.fh, name)


def _fetch(plan: RepoPlan, f: RemoteFile, token: str | None, bar: Progress) -> None:
    url = resolve_url(plan.spec.repo, plan.commit, f.name)
    meta = get_hf_file_metadata(url, token=token, endpoint=hub_endpoint())
    headers = build_hf_headers(token=token)
    if urlparse(meta.location).netloc != urlparse(url).netloc:
        headers.pop("authorization", None)  # a CDN link is signed; the Hub token stays with the Hub
    part = partial_path(plan.folder, f)
    part.parent.mkdir(parents=True, exist_ok=True)
    for stale in part.parent.glob(f"{f.name.replace('/', '--')}.*.part"):
        if stale != part:
            stale.unlink()  # an older version of the file: it cannot be resumed into this one
    have = part.stat().st_size if part.is_file() else 0
    if have > f.size:
        part.unlink()
        have = 0
    task = bar.add_task(f"{plan.role}: {f.name}", total=f.size, completed=have)
    with open(part, "ab") as fh:
        try:
            http_get(meta.location, _Capped(fh, f.size), resume_size=have, headers=headers,  # type: ignore[arg-type]
                     expected_size=f.size, displayed_filename=f.name, tqdm_class=_progress_class(bar, task))
        except _Oversized:
            fh.close()
            part.unlink()
            raise BuunError(f"the Hub sent more of {plan.spec.repo}/{f.name} than the {f.size} bytes it announced; "
                            "the transfer was cut off there and discarded",
                            "run the same command again; if it repeats, the Hub or a proxy in between "
                            f"({shown_endpoint()}) serves something else than it lists", Exit.NETWORK) from None


def _verify_and_place(plan: RepoPlan, f: RemoteFile) -> dict[str, Any]:
    part = partial_path(plan.folder, f)
    size = part.stat().st_size
    sha256, git_oid = file_hashes(part)
    problem = None
    if size != f.size:
        problem = f"size {size}, the Hub says {f.size}"
    elif f.sha256 and sha256 != f.sha256:
        problem = f"sha256 {sha256}, the Hub says {f.sha256}"
    elif not f.sha256 and f.git_oid and git_oid != f.git_oid:
        problem = f"git blob id {git_oid}, the Hub says {f.git_oid}"
    if problem:
        part.unlink()
        raise BuunError(f"{plan.spec.repo}/{f.name} arrived corrupted ({problem}); the partial file was removed",
                        "run the same command again to download it anew")
    dest = plan.folder / f.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, dest)
    return {"size": size, "sha256": sha256, "git_oid": git_oid, "lfs": f.sha256 is not None,
            "mtime_ns": dest.stat().st_mtime_ns}


def _record(plan: RepoPlan, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    manifest = read_manifest(plan.folder) or {"files": {}}
    manifest.update({"role": plan.role, "repo": plan.spec.repo, "revision": plan.spec.revision,
                     "commit": plan.commit, "endpoint": shown_endpoint()})
    manifest["files"] = {k: v for k, v in manifest["files"].items() if k in plan.spec.files}
    manifest["files"].update(entries)
    write_json_atomic(plan.folder / MANIFEST, manifest)
    return manifest


def download(plan: RepoPlan, recipe: Recipe, token: str | None, bar: Progress) -> int:
    """Fetch what the plan lacks; record every file (fetched or kept) in the manifest."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    _record(plan, plan.kept)
    fetched = 0
    for f in plan.to_fetch:
        try:
            _fetch(plan, f, token, bar)
        except NETWORK_ERRORS as exc:
            raise hub_error(exc, recipe, plan.role, plan.spec, f.name) from exc
        _record(plan, {f.name: _verify_and_place(plan, f)})
        fetched += f.size
    partial = plan.folder / PARTIAL_DIR
    if partial.is_dir() and not any(partial.iterdir()):
        partial.rmdir()
    return fetched
