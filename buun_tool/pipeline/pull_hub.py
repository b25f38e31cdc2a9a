"""The pull stage's side of the Hub: where it is (HF_ENDPOINT, HF_HUB_OFFLINE, read at call time),
what it lists of a repo (commit, files, sizes, hashes), checked before any of it names a path, and
the one message and exit code for each way asking it or downloading from it fails."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import quote

import httpx2
from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from buun_tool.base.cmdline import without_password
from buun_tool.base.errors import DISK_FULL, BuunError, Exit
from buun_tool.formats.recipes import Recipe, RepoSpec, is_index


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files only
    git_oid: str | None  # git blob id (sha1 of "blob <size>\0" + content)

    @property
    def content_id(self) -> str:
        return self.sha256 or self.git_oid or f"size-{self.size}"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def shown_endpoint() -> str:
    """HF_ENDPOINT as messages and the manifest show it: a mirror's password (https://user:pass@host) masked."""
    return without_password(hub_endpoint())


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but at call time (its constant is fixed at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.is_offline_mode() or value.strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve_url(repo: str, commit: str, filename: str) -> str:
    """The Hub's download URL of a file at a commit (built here: huggingface_hub's `hf_hub_url`
    only swaps in an endpoint that differs from the one it read at import)."""
    return f"{hub_endpoint()}/{repo}/resolve/{quote(commit, safe='')}/{quote(filename)}"


def hub_error(exc: BaseException, recipe: Recipe, role: str, spec: RepoSpec, filename: str | None = None) -> BuunError:
    """One message and exit code per way a download can fail (most specific first)."""
    where = f"{recipe.source}, field {role}"
    page = f"{shown_endpoint()}/{spec.repo}"
    if isinstance(exc, GatedRepoError):
        why = "your token has no access to it" if get_token() else "no token was sent"
        return BuunError(
            f"{spec.repo} is a gated repository and {why}",
            f"request access at {page}, then log in (`hf auth login`) or set HF_TOKEN", Exit.GATED)
    if isinstance(exc, RevisionNotFoundError):
        return BuunError(f"{spec.repo} has no revision '{spec.revision}'",
                         f"fix {role}.revision in {recipe.source} (a branch, tag or commit of {page})", Exit.NOT_FOUND)
    if isinstance(exc, EntryNotFoundError):
        return BuunError(f"{spec.repo} at {spec.revision} has no file '{filename}'",
                         f"check the file names under {where} against {page}/tree/{spec.revision}", Exit.NOT_FOUND)
    if isinstance(exc, RepositoryNotFoundError):
        return BuunError(f"repository {spec.repo} does not exist on {shown_endpoint()} (or is private)",
                         f"check {role}.repo in {recipe.source}; for a private repo log in (`hf auth login`)",
                         Exit.NOT_FOUND)
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        return BuunError(f"the Hub refused access to {spec.repo} (HTTP {exc.response.status_code})",
                         "check your token: `hf auth whoami`, or unset HF_TOKEN", Exit.GATED)
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return BuunError(f"the Hub answered HTTP {status} for {spec.repo}{' ' + filename if filename else ''}",
                         "try again later; finished files are kept and partial ones resume", Exit.NETWORK)
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return BuunError(f"the disk filled up while downloading {spec.repo}{' ' + filename if filename else ''}",
                         "free some space and run again: the partial file resumes", Exit.DISK)
    if isinstance(exc, PermissionError):
        return BuunError(f"cannot write the download of {spec.repo}: {exc}", "check the models folder's permissions")
    if isinstance(exc, OfflineModeIsEnabled):
        return BuunError(f"cannot download {spec.repo}: offline mode is on", "unset HF_HUB_OFFLINE", Exit.NETWORK)
    return BuunError(
        f"cannot reach the Hub at {shown_endpoint()} ({type(exc).__name__}: {str(exc).strip() or 'no answer'})",
        "check the network (or HF_ENDPOINT); finished files are kept and the next run resumes partial ones. "
        "With everything already downloaded, HF_HUB_OFFLINE=1 skips the Hub", Exit.NETWORK)


NETWORK_ERRORS = (httpx2.HTTPError, OSError)  # HfHubHTTPError is both; it is sorted out in hub_error


def remote_files(api: HfApi, spec: RepoSpec, token: str | None) -> tuple[str, dict[str, RemoteFile]]:
    info = api.model_info(spec.repo, revision=spec.revision, files_metadata=True, token=token)
    files = {}
    for s in info.siblings or []:
        files[s.rfilename] = RemoteFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0),
                                        s.lfs.sha256 if s.lfs else None, s.blob_id)
    if not info.sha:
        raise BuunError(f"the Hub returned no commit for {spec.repo}@{spec.revision}")
    return info.sha, files


# What the Hub's listing gives a file, as the Hub writes it: the LFS sha256 and the git blob id
# name the partial file (pull_disk.partial_path), so a listing that could say anything (a mirror
# at HF_ENDPOINT) must not put a '/' or '..' into a path.
_HEX_ID = {"sha256": re.compile(r"[0-9a-f]{64}"), "git blob id": re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")}


def check_listed(f: RemoteFile, spec: RepoSpec) -> None:
    for what, value in (("sha256", f.sha256), ("git blob id", f.git_oid)):
        if value is not None and not (isinstance(value, str) and _HEX_ID[what].fullmatch(value)):
            bad = f"the {what} {value!r:.80}"
            break
    else:
        if is_index(f.size):
            return
        bad = f"the size {f.size!r:.80}"
    raise BuunError(f"the Hub's listing of {spec.repo}@{spec.revision} gives {f.name} {bad}, which no Hub writes; "
                    "nothing was downloaded",
                    f"check HF_ENDPOINT ({shown_endpoint()}): it must be the Hub or a mirror that serves its format",
                    Exit.NETWORK)
