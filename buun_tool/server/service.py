"""A systemd user unit that runs the supervisor in the foreground on a saved launch spec.

`buun service install` resolves the launch as `buun start` would and saves the spec in the
instance folder (service.json); the unit runs `python -m buun_tool.server.supervisor NAME --spec
FILE`, which launches it the way `buun serve` does. No command-line option of buun is in the unit,
so renaming one cannot break an installed unit; a spec written by another version of buun is
refused with the command to run. systemd restarts the supervisor itself if it ever dies; the
supervisor restarts llama-server. KillMode=mixed sends SIGTERM to the supervisor alone (it stops
the server in order) and SIGKILL to whatever is left after TimeoutStopSec. No secret is saved:
pass --api-key-file, which llama-server reads itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import buun_tool
from buun_tool.base import paths
from buun_tool.base.errors import BuunError, NotReadyError
from buun_tool.pipeline import patches
from buun_tool.server.instance import Instance
from buun_tool.server.spec import LaunchSpec

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


def _quoted(text: str) -> str:
    """`text` in double quotes as systemd.syntax unquotes them, with C escapes: a backslash and a
    quote escaped, a control character (a newline above all, which would end the line and start
    a directive of its own) as \\xNN."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text) + '"'


def quote(arg: str) -> str:
    """One ExecStart word: double-quoted when needed; `%` and `$` escaped so systemd takes them literally."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r'[\s"\'\\;\x00-\x1f\x7f]', arg):
        return arg
    return _quoted(arg)


def _env_line(key: str, value: str) -> str:
    """Environment= takes quoted assignments, C escapes unescaped; specifiers (%) are expanded,
    variables are not ($ is taken as it is, systemd.exec says)."""
    return f"Environment={_quoted(f'{key}={value}'.replace('%', '%%'))}"


def exec_argv(instance: str, spec_file: Path) -> list[str]:
    """The supervisor on the saved spec, with this interpreter: works from a checkout or an install."""
    return [sys.executable, "-m", "buun_tool.server.supervisor", instance, "--spec", str(spec_file)]


def render(instance: str, spec_file: Path, stop_timeout: float, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    pkg_root = Path(buun_tool.__file__).resolve().parent.parent
    # WorkingDirectory= is taken unquoted and stripped: no escape writes a newline or an end space
    if re.search(r"[\x00-\x1f\x7f]", str(pkg_root)) or str(pkg_root) != str(pkg_root).strip():
        raise BuunError(f"buun's folder {str(pkg_root)!r} has a control character or white space at its end, "
                        "which a systemd unit's WorkingDirectory= cannot hold",
                        "install buun in a folder with a plain name, or run the server with `buun start`")
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
        f"ExecStart={' '.join(quote(a) for a in exec_argv(instance, spec_file))}",
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


def _settings(spec: dict[str, Any]) -> dict[str, Any]:
    """A saved spec without its run id (each launch gets its own) and whether a launch had a key."""
    return {k: v for k, v in spec.items() if k not in ("run_id", "keyed")}


def install(spec: LaunchSpec, force: bool = False) -> Path:
    """Save the launch spec and write the unit that runs it; another unit or spec of the same
    instance is only replaced with `force`."""
    inst = Instance(spec.name)
    path = unit_dir() / unit_name(spec.name)
    text = render(spec.name, inst.service_spec_file, spec.policy.stop_timeout)
    saved = inst.read_service_spec()
    if not force and ((path.exists() and path.read_text() != text)
                      or (saved is not None and _settings(saved) != _settings(spec.to_json()))):
        raise BuunError(f"{path} exists with other settings", "pass --force to overwrite it")
    inst.write_service_spec(spec.to_json())
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
    Instance(instance).service_spec_file.unlink(missing_ok=True)
    return path


def enable_now(instance: str) -> None:
    if not shutil.which("systemctl"):
        raise NotReadyError("systemctl is not installed", "start the server with `buun start` instead")
    for args in (["daemon-reload"], ["enable", "--now", unit_name(instance)]):
        r = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuunError(f"systemctl --user {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}",
                            "a user systemd needs a login session (or `loginctl enable-linger $USER`)")
