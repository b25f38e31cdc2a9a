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

The parts: the Hub's side (pull_hub.py), the manifest and the checks of files against it
(pull_manifest.py), each repo's plan (pull_plan.py), disk space and partial files (pull_disk.py),
the transfer (pull_transfer.py); this module runs them in order under the models folder's lock.
Their names are pull's too: callers say pull.plan_repo, pull.bytes_needed, pull.MANIFEST.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, get_token
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TransferSpeedColumn

from buun_tool.base import console, locks
from buun_tool.base.errors import BuunError, Exit, NotReadyError
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import stage
from buun_tool.pipeline.pull_disk import (
    DISK_RESERVE,
    PARTIAL_DIR,
    bytes_needed,
    check_disk,
    disk_hint,
    gb,
    stale_partials,
)
from buun_tool.pipeline.pull_hub import RemoteFile, hub_endpoint, hub_offline, resolve_url, shown_endpoint
from buun_tool.pipeline.pull_manifest import MANIFEST, read_manifest, unchanged
from buun_tool.pipeline.pull_plan import RepoPlan, plan_repo
from buun_tool.pipeline.pull_transfer import download

__all__ = [
    # pull_hub.py, pull_manifest.py, pull_plan.py, pull_disk.py, pull_transfer.py
    "RemoteFile", "hub_endpoint", "shown_endpoint", "hub_offline", "resolve_url", "MANIFEST", "read_manifest",
    "unchanged", "RepoPlan", "plan_repo", "PARTIAL_DIR", "DISK_RESERVE", "bytes_needed", "stale_partials",
    "disk_hint", "check_disk", "download",
    # the stage's own
    "ROLES", "require_pulled", "stage_status", "RoleResult", "PullResult", "bar_columns", "pull",
]

ROLES = ("target", "drafter", "tokenizer")


# --- what later stages ask ------------------------------------------------------------------

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


def check_hub(recipe: Recipe, models_dir: Path) -> None:
    """The Hub lists every repo of the recipe, with its files, now (what pull asks first): setup
    asks before its build (10-20 minutes), so that a Hub out of reach, a gated repo or a missing
    file is said in seconds, with pull's own message (hub_error), not after the build. Nothing is
    written. With HF_HUB_OFFLINE pull reads the disk only, and so does this: nothing to ask."""
    if hub_offline():
        return
    lay = layout.for_recipe(recipe, models_dir)
    token = get_token()
    api = HfApi(endpoint=hub_endpoint(), token=token)
    for role in ROLES:
        plan_repo(api, recipe, role, lay.role_dir(role), token, verify=False)


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


def bar_columns() -> tuple[ProgressColumn, ...]:
    """The transfer's progress display: a line a file, with its bar, bytes and speed."""
    return TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()


def pull(recipe: Recipe, models_dir: Path, roles: tuple[str, ...] = ROLES,
         verify: bool = False, on_plan: Callable[[list[RepoPlan]], None] | None = None,
         bar: Progress | None = None) -> PullResult:
    """Download (or confirm) every file of the recipe's repos for `roles`. `bar`: the progress the
    transfer reports to, which its caller shows (setup's, while the build runs); by default pull's
    own, live on the terminal while it runs."""
    models_dir.mkdir(parents=True, exist_ok=True)
    with locks.models_folder(models_dir):  # two downloads of a file would append to one partial file
        return _pull(recipe, models_dir, roles, verify, on_plan, bar)


def _pull(recipe: Recipe, models_dir: Path, roles: tuple[str, ...], verify: bool,
          on_plan: Callable[[list[RepoPlan]], None] | None, given: Progress | None) -> PullResult:
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
    with (nullcontext(given) if given is not None
          else Progress(*bar_columns(), console=console.err, transient=True)) as bar:
        for p in plans:
            if p.to_fetch:
                console.step(f"{p.role}: {p.spec.repo}@{p.commit[:12]}: "
                             f"{len(p.to_fetch)} file(s), {gb(sum(f.size for f in p.to_fetch))}")
            n = download(p, recipe, token, bar)
            results.append(RoleResult(p.role, p.spec.repo, p.spec.revision, p.commit, str(p.folder),
                                      [f.name for f in p.files], [f.name for f in p.to_fetch], n))
    for r in results:
        console.ok(f"{r.role}: {r.repo}@{(r.commit or '')[:12]} in {r.folder}"
                   + (f" ({len(r.downloaded)} downloaded)" if r.downloaded else " (up to date)"))
    return PullResult(recipe.name, False, results)
