"""A systemd user unit that runs the supervisor in the foreground (`buun serve ...`).

systemd then restarts the supervisor itself if it ever dies; the supervisor restarts
llama-server. KillMode=mixed sends SIGTERM to the supervisor alone (it stops the server in
order) and SIGKILL to whatever is left after TimeoutStopSec. The API key is never written into
the unit: pass --api-key-file, which llama-server reads itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import buun_tool
from buun_tool import patches, paths
from buun_tool.errors import BuunError, NotReadyError

# Environment that decides where buun finds things; carried into the unit so the service sees
# the same folders and binaries as the shell that installed it.
CARRIED_ENV = ("BUUN_ROOT", "BUUN_DATA_DIR", "BUUN_STATE_DIR", "BUUN_CACHE_DIR", "BUUN_CONFIG_DIR",
               "BUUN_MODELS_DIR", "BUUN_LLAMA_DIR", "BUUN_BUILD_DIR", "BUUN_LLAMA_BIN_DIR",
               "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES",
               *patches.SWITCHES)  # the service runs the patched server as the shell would


def unit_dir() -> Path:
    return paths.systemd_user_dir()


def unit_name(instance: str) -> str:
    return f"buun-{instance}.service"


def quote(arg: str) -> str:
    """One ExecStart word: double-quoted when needed; `%` and `$` escaped so systemd takes them literally."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r'[\s"\'\\;]', arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_line(key: str, value: str) -> str:
    """Environment= takes quoted assignments; specifiers (%) are expanded, variables are not."""
    assignment = f"{key}={value}".replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{assignment}"'


def serve_argv(serve_args: Sequence[str]) -> list[str]:
    """`python -m buun_tool serve ...` with this interpreter: works from a checkout or an install."""
    return [sys.executable, "-m", "buun_tool", "serve", *serve_args]


def render(instance: str, serve_args: Sequence[str], stop_timeout: float, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    pkg_root = Path(buun_tool.__file__).resolve().parent.parent
    lines = [
        "# Written by `buun service install`; re-run it to change the settings.",
        "[Unit]",
        f"Description=buun: llama-server with DFlash ({instance})",
        "After=network.target",
        "",
        "[Service]",
        "Type=simple",
        f"WorkingDirectory={str(pkg_root).replace('%', '%%')}",
        *(_env_line(k, env[k]) for k in CARRIED_ENV if env.get(k)),
        f"ExecStart={' '.join(quote(a) for a in serve_argv(serve_args))}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "KillMode=mixed",
        f"TimeoutStopSec={int(stop_timeout) + 15}",
        "Restart=on-failure",
        "RestartSec=10",
        "# bad arguments, missing files, a taken port: another try fails the same way",
        "RestartPreventExitStatus=2 3 8",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def install(instance: str, serve_args: Sequence[str], stop_timeout: float, force: bool = False) -> Path:
    path = unit_dir() / unit_name(instance)
    text = render(instance, serve_args, stop_timeout)
    if path.exists() and not force and path.read_text() != text:
        raise BuunError(f"{path} exists with other settings", "pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def uninstall(instance: str) -> Path | None:
    path = unit_dir() / unit_name(instance)
    if not path.exists():
        return None
    if shutil.which("systemctl"):
        subprocess.run(["systemctl", "--user", "disable", "--now", unit_name(instance)], capture_output=True)
    path.unlink()
    return path


def enable_now(instance: str) -> None:
    if not shutil.which("systemctl"):
        raise NotReadyError("systemctl is not installed", "start the server with `buun start` instead")
    for args in (["daemon-reload"], ["enable", "--now", unit_name(instance)]):
        r = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuunError(f"systemctl --user {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}",
                            "a user systemd needs a login session (or `loginctl enable-linger $USER`)")
