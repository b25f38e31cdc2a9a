"""Every place buun reads or writes, in one module.

Two roots: the checkout (pin, patches, recipes, the vendored tree and its builds) and the
user's XDG directories (models, caches, server state). Stages ask this module
for paths; none builds another stage's paths by hand.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# A name that becomes one folder's or file's name under buun's directories (an instance, a recipe's
# converted drafter and its log): no '/' and no leading '.', so that it cannot point elsewhere.
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FOLDER_NAME_RULE = "letters, digits, '.', '_' and '-' (up to 64), starting with a letter or digit"


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else default


def project_root() -> Path:
    """The buun checkout: where pyproject.toml, vendor/, patches/ and recipes/ live."""
    override = os.environ.get("BUUN_ROOT")
    if override:
        return Path(override).expanduser().resolve()
    return Path(__file__).resolve().parents[2]  # buun_tool/base/paths.py


def vendor_dir() -> Path:
    return project_root() / "vendor"


def pin_file() -> Path:
    return vendor_dir() / "pin.yaml"


def llama_dir() -> Path:
    """The vendored llama.cpp tree (a local git repo: baseline commit + applied patches)."""
    return _env_path("BUUN_LLAMA_DIR", vendor_dir() / "llama.cpp")


def build_dir(variant: str) -> Path:
    return _env_path("BUUN_BUILD_DIR", vendor_dir() / "build") / variant


def patches_dir() -> Path:
    return _env_path("BUUN_PATCHES_DIR", project_root() / "patches")


def recipes_dir() -> Path:
    return project_root() / "recipes"


def _xdg(var: str, fallback: str) -> Path:
    return _env_path(var, Path.home() / fallback) / "buun"


def data_dir() -> Path:
    return _env_path("BUUN_DATA_DIR", _xdg("XDG_DATA_HOME", ".local/share"))


def cache_dir() -> Path:
    return _env_path("BUUN_CACHE_DIR", _xdg("XDG_CACHE_HOME", ".cache"))


def state_dir() -> Path:
    return _env_path("BUUN_STATE_DIR", _xdg("XDG_STATE_HOME", ".local/state"))


def config_dir() -> Path:
    return _env_path("BUUN_CONFIG_DIR", _xdg("XDG_CONFIG_HOME", ".config"))


def models_dir(given: Path | None = None) -> Path:
    """Where models live: `given` (a command's --models-dir), else BUUN_MODELS_DIR, else the data
    dir's models/. Each command resolves it once and passes the folder down: the stages below
    never resolve it again, so no two of them can disagree on where the models are."""
    folder = Path(given).expanduser() if given else _env_path("BUUN_MODELS_DIR", data_dir() / "models")
    return folder.absolute()


def instances_dir() -> Path:
    """PID, state and log files of supervised servers, one folder per instance."""
    return state_dir() / "instances"


def workers_dir() -> Path:
    """State and log files of supervised RPC workers (`buun worker`), one folder per worker."""
    return state_dir() / "workers"


def synthetic_models_dir(models: Path) -> Path:
    """Random-weight models of a recipe's geometry (`buun synth`), in the models folder."""
    return models / "synthetic"


def bench_dir() -> Path:
    """Benchmark results (`buun bench`), one folder per run."""
    return data_dir() / "bench"


def systemd_user_dir() -> Path:
    """Where `buun service install` writes systemd user units."""
    return _env_path("XDG_CONFIG_HOME", Path.home() / ".config") / "systemd" / "user"


def tuned_dir() -> Path:
    """`buun tune`'s overlays, one file per recipe and card model (server/tuned.py)."""
    return state_dir() / "tuned"


def tune_runs_dir() -> Path:
    """The evidence of each `buun tune` run (its bench.json and report), one folder per run."""
    return data_dir() / "tune"
