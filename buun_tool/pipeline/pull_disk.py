"""The pull stage on disk: where an unfinished download resumes from (`.buun-partial/`), how much
a download still needs, whether it fits, and what to delete when it does not."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from buun_tool.base.errors import BuunError, Exit
from buun_tool.pipeline.pull_hub import RemoteFile
from buun_tool.pipeline.pull_plan import RepoPlan

PARTIAL_DIR = ".buun-partial"
# Left free after the download: the converter, the logs and the OS need some room too.
DISK_RESERVE = 256 * 2**20


def partial_path(folder: Path, f: RemoteFile) -> Path:
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
            part = partial_path(p.folder, f)
            total += f.size - (part.stat().st_size if part.is_file() else 0)
    return total


def stale_partials(root: Path, plans: Sequence[RepoPlan] = ()) -> list[Path]:
    """buun's own unfinished downloads under `root` that none of `plans` resumes: older versions
    of a file, files a recipe no longer lists, other recipes' leftovers."""
    resumed = {partial_path(p.folder, f) for p in plans for f in p.to_fetch}
    return sorted(p for p in root.glob(f"*/*/{PARTIAL_DIR}/*.part") if p not in resumed and p.is_file())


def disk_hint(root: Path, need: int, free: int, plans: Sequence[RepoPlan] = ()) -> str:
    """What to do when `need` bytes do not fit in `free`: first buun's own stale partial files."""
    hint = "free some space or pass --models-dir on a larger disk (BUUN_MODELS_DIR works too)"
    stale = stale_partials(root, plans)
    if not stale:
        return hint
    size = sum(p.stat().st_size for p in stale)
    enough = "enough on its own" if free + size >= need else "not enough on its own"
    return (f"{len(stale)} unfinished download(s) of buun's that nothing resumes take {gb(size)} ({enough}); "
            f"delete them: rm {' '.join(shlex.quote(str(p)) for p in stale)}; or {hint}")


def check_disk(plans: list[RepoPlan], root: Path) -> None:
    need = bytes_needed(plans)
    if need == 0:
        return  # nothing to download: the manifest's few bytes need no reserve
    free = shutil.disk_usage(_existing_parent(root)).free
    if need + DISK_RESERVE > free:
        raise BuunError(
            f"not enough disk space in {root}: the download needs {gb(need)} (+{gb(DISK_RESERVE)} spare), "
            f"{gb(free)} is free", disk_hint(root, need + DISK_RESERVE, free, plans), Exit.DISK)


def gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
