"""What a pull does to one repo, decided before a byte is fetched: the Hub's commit and listing,
checked, and which of the recipe's files are already on disk as listed (kept) or to download."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.errors import EntryNotFoundError

from buun_tool.formats.recipes import Recipe, RepoSpec
from buun_tool.pipeline.pull_hub import NETWORK_ERRORS, RemoteFile, check_listed, hub_error, remote_files
from buun_tool.pipeline.pull_manifest import local_entry, read_manifest


@dataclass
class RepoPlan:
    role: str
    spec: RepoSpec
    folder: Path
    commit: str
    files: list[RemoteFile]
    to_fetch: list[RemoteFile] = field(default_factory=list)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # manifest entries of good local files


def plan_repo(api: HfApi, recipe: Recipe, role: str, folder: Path, token: str | None, verify: bool) -> RepoPlan:
    spec = recipe.repos()[role]
    try:
        commit, remote = remote_files(api, spec, token)
    except NETWORK_ERRORS as exc:
        raise hub_error(exc, recipe, role, spec) from exc
    missing = [f for f in spec.files if f not in remote]
    if missing:
        raise hub_error(EntryNotFoundError(missing[0]), recipe, role, spec, ", ".join(missing))
    recorded = (read_manifest(folder) or {"files": {}})["files"]
    plan = RepoPlan(role, spec, folder, commit, [remote[f] for f in spec.files])
    for f in plan.files:
        check_listed(f, spec)
    for f in plan.files:
        entry = local_entry(folder, recorded.get(f.name), f, verify)
        if entry is None:
            plan.to_fetch.append(f)
        else:
            plan.kept[f.name] = entry
    return plan
