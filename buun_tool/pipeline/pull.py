"""Stage: download the recipe's repos (target GGUF, drafter checkpoint, tokenizer) from the Hub.

Every repo lands in `models_dir/<role>/<owner>--<name>/`; formats/layout.py is the one place that
knows those folders and the converted files' names, so later stages never build model paths.

Before a byte is fetched, each repo is asked for its commit and file list (sizes, LFS sha256):
a gated or missing repo, revision or file fails at once with its own exit code, and the whole
download is checked against the free disk space. Files stream into `.buun-partial/` and resume
from there after an interruption, in the same run (the client retries with a Range request) or
in the next one. Each finished file is checked (size, then the LFS sha256 or the git blob id)
and recorded in the folder's `buun-manifest.json`. HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are
read when `pull` runs, with the meaning huggingface_hub gives them.

huggingface_hub's own `hf_hub_download` is not used for the transfer: since 1.x it deletes a
partial file when a download fails, so a 16 GB target would restart from zero after Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, get_token
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from buun_tool.base import console, locks
from buun_tool.base.cmdline import without_password
from buun_tool.base.errors import DISK_FULL, BuunError, Exit, NotReadyError
from buun_tool.base.fsutil import write_json_atomic
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe, RepoSpec, is_index
from buun_tool.pipeline import stage

ROLES = ("target", "drafter", "tokenizer")
MANIFEST = "buun-manifest.json"
PARTIAL_DIR = ".buun-partial"
# Left free after the download: the converter, the logs and the OS need some room too.
DISK_RESERVE = 256 * 2**20


# --- where models live ----------------------------------------------------------------------

# --- the manifest ---------------------------------------------------------------------------

def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def require_pulled(recipe: Recipe, role: str, models_dir: Path) -> tuple[Path, dict[str, Any]]:
    """For later stages: a role's folder and manifest, or an error saying to pull."""
    folder = layout.for_recipe(recipe, models_dir).role_dir(role)
    manifest = read_manifest(folder)
    spec = recipe.repos()[role]
    missing = [f for f in spec.files if manifest is None or f not in manifest["files"]
               or not (folder / f).is_file()]
    if missing:
        raise NotReadyError(f"the {role} ({spec.repo}) is not downloaded: missing {', '.join(missing)} in {folder}",
                            f"run `buun pull {recipe.ref}`")
    return folder, manifest  # type: ignore[return-value]


def stage_status(recipe: Recipe, models_dir: Path) -> stage.StageStatus:
    """The pull stage's own answer, from its manifests (the Hub is not asked): current when every
    role's folder holds the recipe's repo and revision, each file as `pull` verified it."""
    lay = layout.for_recipe(recipe, models_dir)
    for role, spec in recipe.repos().items():
        folder = lay.role_dir(role)
        manifest = read_manifest(folder)
        if manifest is None:
            return stage.stale(f"the {role} ({spec.repo}) is not downloaded to {folder}")
        if (manifest.get("repo"), manifest.get("revision")) != (spec.repo, spec.revision):
            return stage.stale(f"the {role} folder holds {manifest.get('repo')}@{manifest.get('revision')}; "
                         f"the recipe names {spec.repo}@{spec.revision}")
        for name in spec.files:
            entry = manifest["files"].get(name)
            if entry is None or not (folder / name).is_file():
                return stage.stale(f"{folder / name} is not downloaded")
            if not unchanged(folder / name, entry):
                return stage.stale(f"{folder / name} changed on disk since it was verified")
    return stage.current(f"the recipe's repos as verified, in {lay.root}")


# --- what the Hub says ----------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # LFS files only
    git_oid: str | None  # git blob id (sha1 of "blob <size>\0" + content)

    @property
    def content_id(self) -> str:
        return self.sha256 or self.git_oid or f"size-{self.size}"


@dataclass
class RepoPlan:
    role: str
    spec: RepoSpec
    folder: Path
    commit: str
    files: list[RemoteFile]
    to_fetch: list[RemoteFile] = field(default_factory=list)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # manifest entries of good local files


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def shown_endpoint() -> str:
    """HF_ENDPOINT as messages and the manifest show it: a mirror's password (https://user:pass@host) masked."""
    return without_password(hub_endpoint())


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but at call time (its constant is fixed at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.is_offline_mode() or value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_error(exc: BaseException, recipe: Recipe, role: str, spec: RepoSpec, filename: str | None = None) -> BuunError:
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


_NETWORK_ERRORS = (httpx2.HTTPError, OSError)  # HfHubHTTPError is both; it is sorted out in _hub_error


def _remote_files(api: HfApi, spec: RepoSpec, token: str | None) -> tuple[str, dict[str, RemoteFile]]:
    info = api.model_info(spec.repo, revision=spec.revision, files_metadata=True, token=token)
    files = {}
    for s in info.siblings or []:
        files[s.rfilename] = RemoteFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0),
                                        s.lfs.sha256 if s.lfs else None, s.blob_id)
    if not info.sha:
        raise BuunError(f"the Hub returned no commit for {spec.repo}@{spec.revision}")
    return info.sha, files


# What the Hub's listing gives a file, as the Hub writes it: the LFS sha256 and the git blob id
# name the partial file (_partial_path), so a listing that could say anything (a mirror at
# HF_ENDPOINT) must not put a '/' or '..' into a path.
_HEX_ID = {"sha256": re.compile(r"[0-9a-f]{64}"), "git blob id": re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")}


def _check_listed(f: RemoteFile, spec: RepoSpec) -> None:
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


def _matches(remote: RemoteFile, sha256: str | None, git_oid: str | None) -> bool:
    if remote.sha256:
        return sha256 == remote.sha256
    return remote.git_oid is None or git_oid == remote.git_oid


def _local_entry(folder: Path, entry: dict[str, Any] | None, remote: RemoteFile, verify: bool) -> dict[str, Any] | None:
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
    sha256, git_oid = _hashes(path)
    if not _matches(remote, sha256, git_oid):
        return None
    return {"size": remote.size, "sha256": sha256, "git_oid": git_oid, "lfs": remote.sha256 is not None,
            "mtime_ns": st.st_mtime_ns}


def unchanged(path: Path, entry: dict[str, Any]) -> bool:
    """Whether a manifest entry's hashes still hold for `path`: the size and mtime it had when
    it was hashed. Any write (a flipped byte, a copy) changes the mtime."""
    st = path.stat()
    return entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns


def plan_repo(api: HfApi, recipe: Recipe, role: str, folder: Path, token: str | None, verify: bool) -> RepoPlan:
    spec = recipe.repos()[role]
    try:
        commit, remote = _remote_files(api, spec, token)
    except _NETWORK_ERRORS as exc:
        raise _hub_error(exc, recipe, role, spec) from exc
    missing = [f for f in spec.files if f not in remote]
    if missing:
        raise _hub_error(EntryNotFoundError(missing[0]), recipe, role, spec, ", ".join(missing))
    recorded = (read_manifest(folder) or {"files": {}})["files"]
    plan = RepoPlan(role, spec, folder, commit, [remote[f] for f in spec.files])
    for f in plan.files:
        _check_listed(f, spec)
    for f in plan.files:
        entry = _local_entry(folder, recorded.get(f.name), f, verify)
        if entry is None:
            plan.to_fetch.append(f)
        else:
            plan.kept[f.name] = entry
    return plan


# --- disk space -----------------------------------------------------------------------------

def _partial_path(folder: Path, f: RemoteFile) -> Path:
    """The resumable download of one version of a file (a new version starts a new partial)."""
    return folder / PARTIAL_DIR / f"{f.name.replace('/', '--')}.{f.content_id[:16]}.part"


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def bytes_needed(plans: list[RepoPlan]) -> int:
    total = 0
    for p in plans:
        for f in p.to_fetch:
            part = _partial_path(p.folder, f)
            total += f.size - (part.stat().st_size if part.is_file() else 0)
    return total


def stale_partials(root: Path, plans: Sequence[RepoPlan] = ()) -> list[Path]:
    """buun's own unfinished downloads under `root` that none of `plans` resumes: older versions
    of a file, files a recipe no longer lists, other recipes' leftovers."""
    resumed = {_partial_path(p.folder, f) for p in plans for f in p.to_fetch}
    return sorted(p for p in root.glob(f"*/*/{PARTIAL_DIR}/*.part") if p not in resumed and p.is_file())


def disk_hint(root: Path, need: int, free: int, plans: Sequence[RepoPlan] = ()) -> str:
    """What to do when `need` bytes do not fit in `free`: first buun's own stale partial files."""
    hint = "free some space or pass --models-dir on a larger disk (BUUN_MODELS_DIR works too)"
    stale = stale_partials(root, plans)
    if not stale:
        return hint
    size = sum(p.stat().st_size for p in stale)
    enough = "enough on its own" if free + size >= need else "not enough on its own"
    return (f"{len(stale)} unfinished download(s) of buun's that nothing resumes take {_gb(size)} ({enough}); "
            f"delete them: rm {' '.join(shlex.quote(str(p)) for p in stale)}; or {hint}")


def check_disk(plans: list[RepoPlan], root: Path) -> None:
    need = bytes_needed(plans)
    if need == 0:
        return  # nothing to download: the manifest's few bytes need no reserve
    free = shutil.disk_usage(_existing_parent(root)).free
    if need + DISK_RESERVE > free:
        raise BuunError(
            f"not enough disk space in {root}: the download needs {_gb(need)} (+{_gb(DISK_RESERVE)} spare), "
            f"{_gb(free)} is free", disk_hint(root, need + DISK_RESERVE, free, plans), Exit.DISK)


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# --- transfer -------------------------------------------------------------------------------

def _hashes(path: Path) -> tuple[str, str]:
    """sha256 of the content and its git blob id, in one pass."""
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def resolve_url(repo: str, commit: str, filename: str) -> str:
    """The Hub's download URL of a file at a commit (built here: huggingface_hub's `hf_hub_url`
    only swaps in an endpoint that differs from the one it read at import)."""
    return f"{hub_endpoint()}/{repo}/resolve/{quote(commit, safe='')}/{quote(filename)}"


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
    part = _partial_path(plan.folder, f)
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
    part = _partial_path(plan.folder, f)
    size = part.stat().st_size
    sha256, git_oid = _hashes(part)
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
        except _NETWORK_ERRORS as exc:
            raise _hub_error(exc, recipe, plan.role, plan.spec, f.name) from exc
        _record(plan, {f.name: _verify_and_place(plan, f)})
        fetched += f.size
    partial = plan.folder / PARTIAL_DIR
    if partial.is_dir() and not any(partial.iterdir()):
        partial.rmdir()
    return fetched


# --- the stage ------------------------------------------------------------------------------

@dataclass
class RoleResult:
    role: str
    repo: str
    revision: str
    commit: str | None
    folder: str
    files: list[str]
    downloaded: list[str]
    bytes_downloaded: int


@dataclass
class PullResult:
    recipe: str
    offline: bool
    roles: list[RoleResult]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _offline_result(recipe: Recipe, role: str, folder: Path) -> RoleResult:
    spec = recipe.repos()[role]
    manifest = read_manifest(folder)
    missing = [f for f in spec.files
               if manifest is None or f not in manifest["files"] or not (folder / f).is_file()
               or (folder / f).stat().st_size != manifest["files"][f].get("size")]
    if missing:
        raise BuunError(f"HF_HUB_OFFLINE is set and {spec.repo} is not (completely) downloaded: "
                        f"missing {', '.join(missing)} in {folder}",
                        "unset HF_HUB_OFFLINE to download, or copy a pulled models folder here", Exit.NETWORK)
    assert manifest is not None
    return RoleResult(role, spec.repo, spec.revision, manifest.get("commit"), str(folder), list(spec.files), [], 0)


def pull(recipe: Recipe, models_dir: Path, roles: tuple[str, ...] = ROLES,
         verify: bool = False, on_plan: Callable[[list[RepoPlan]], None] | None = None) -> PullResult:
    """Download (or confirm) every file of the recipe's repos for `roles`."""
    models_dir.mkdir(parents=True, exist_ok=True)
    with locks.models_folder(models_dir):  # two downloads of a file would append to one partial file
        return _pull(recipe, models_dir, roles, verify, on_plan)


def _pull(recipe: Recipe, models_dir: Path, roles: tuple[str, ...], verify: bool,
          on_plan: Callable[[list[RepoPlan]], None] | None) -> PullResult:
    lay = layout.for_recipe(recipe, models_dir)
    if hub_offline():
        results = [_offline_result(recipe, role, lay.role_dir(role)) for role in roles]
        console.ok(f"offline: all files of {recipe.name} are on disk in {lay.root}")
        return PullResult(recipe.name, True, results)
    token = get_token()
    api = HfApi(endpoint=hub_endpoint(), token=token)
    plans = [plan_repo(api, recipe, role, lay.role_dir(role), token, verify) for role in roles]
    if on_plan:
        on_plan(plans)
    check_disk(plans, lay.root)
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console.err, transient=True) as bar:
        for p in plans:
            if p.to_fetch:
                console.step(f"{p.role}: {p.spec.repo}@{p.commit[:12]}: "
                             f"{len(p.to_fetch)} file(s), {_gb(sum(f.size for f in p.to_fetch))}")
            n = download(p, recipe, token, bar)
            results.append(RoleResult(p.role, p.spec.repo, p.spec.revision, p.commit, str(p.folder),
                                      [f.name for f in p.files], [f.name for f in p.to_fetch], n))
    for r in results:
        console.ok(f"{r.role}: {r.repo}@{(r.commit or '')[:12]} in {r.folder}"
                   + (f" ({len(r.downloaded)} downloaded)" if r.downloaded else " (up to date)"))
    return PullResult(recipe.name, False, results)
