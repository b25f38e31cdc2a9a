"""The converter's environment (convert.py's stage runs the vendored converter in it): a venv of
its own with torch (CPU), transformers and numpy, made once under the cache folder and stamped
with what it holds, or an interpreter of the user's own (BUUN_CONVERTER_PYTHON).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from buun_tool.base import console, locks, paths
from buun_tool.base.proc import run_logged

# The converter's dependencies. Its own requirements file pins torch 2.11 from the PyTorch CPU
# index, which many machines cannot reach; 2.13.0 from PyPI (or a local CPU wheel) works.
# transformers and numpy keep the converter's pins: it reads tokenizers through transformers.
CONVERTER_REQUIREMENTS = ("torch==2.13.0", "transformers==4.57.6", "numpy~=2.2.6")
ENV_STAMP = "buun-env.json"


def converter_env_dir(cache: Path | None = None) -> Path:
    return (cache or paths.cache_dir()) / "converter-env"


def _wanted_env() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "requirements": list(CONVERTER_REQUIREMENTS)}


def read_env_stamp(env: Path) -> dict[str, Any] | None:
    try:
        return json.loads((env / ENV_STAMP).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def env_is_current(recorded: Any) -> bool:
    """Whether the converter environment a GGUF's record names is the one `converter_python`
    gives now, judged without making it: an interpreter of the user's own (BUUN_CONVERTER_PYTHON)
    or a made environment by its stamp; one not made yet (or to be made again) by what its
    requirements will install."""
    override = os.environ.get("BUUN_CONVERTER_PYTHON")
    if override:
        return recorded == read_env_stamp(Path(shutil.which(override) or override).parent.parent)
    env = converter_env_dir()
    stamp = read_env_stamp(env)
    if (env / "bin" / "python").is_file() and stamp and {k: stamp.get(k) for k in _wanted_env()} == _wanted_env():
        return recorded == stamp
    return isinstance(recorded, dict) and {k: recorded.get(k) for k in _wanted_env()} == _wanted_env()


def converter_python(cache: Path | None = None) -> Path:
    """The Python of the converter's environment, created on first use.

    A venv of its own, WITHOUT --system-site-packages: the converter needs transformers 4.57,
    which needs huggingface_hub < 1.0, while buun runs on huggingface_hub 2.x; and installing
    torch must not touch the user's own environment.
    """
    override = os.environ.get("BUUN_CONVERTER_PYTHON")
    if override:  # an interpreter that already has torch and transformers: offline machines
        return Path(shutil.which(override) or override)
    env = converter_env_dir(cache)
    python = env / "bin" / "python"
    if _env_made(env):
        return python
    # one environment for every models folder: the first converts of two folders made it at once,
    # each starting by removing the other's half-made one
    with locks.converter_env(env):
        if _env_made(env):  # made by the command this one waited for
            return python
        _make_env(env, python)
    return python


def _env_made(env: Path) -> bool:
    """Whether `env` is a whole environment for this buun's requirements: its stamp is written last."""
    stamp = read_env_stamp(env) or {}
    return (env / "bin" / "python").is_file() and {k: stamp.get(k) for k in _wanted_env()} == _wanted_env()


def _make_env(env: Path, python: Path) -> None:
    log = env.parent / "converter-env.log"
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    console.step(f"creating the converter environment in {env} (torch CPU, transformers; once)")
    hint = ("the converter's packages come from PyPI; see the log. `python -m venv` needs the venv module "
            "(Debian: apt-get install python3-venv)")
    try:
        run_logged([sys.executable, "-m", "venv", env], log, what="creating the converter venv", hint=hint)
        run_logged([python, "-m", "pip", "install", "--disable-pip-version-check", *CONVERTER_REQUIREMENTS],
                   log, what="installing the converter's packages", hint=hint)
        installed = subprocess.run(
            [python, "-c", "import json, numpy, torch, transformers; print(json.dumps({'torch': torch.__version__, "
             "'transformers': transformers.__version__, 'numpy': numpy.__version__}))"],
            capture_output=True, text=True, check=True).stdout
    except BaseException:
        shutil.rmtree(env, ignore_errors=True)  # half an environment must not pass for a whole one
        raise
    (env / ENV_STAMP).write_text(json.dumps({**_wanted_env(), "installed": json.loads(installed)}, indent=2) + "\n")
