"""`make dev` then `make test` from a fresh clone on a stock Debian/Ubuntu, whose system Python
refuses `pip install` (PEP 668): every Python step runs in the checkout's virtual environment,
and the README's install does the same."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_make_dev_and_test_run_in_a_virtual_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-n", "dev", "test", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)  # -n: the commands make would run, none run
    assert out.returncode == 0, out.stderr
    commands = out.stdout
    assert f"python3 -m venv {venv}" in commands and "python3-venv" in commands  # Debian's venv module
    for step in (f"{venv}/bin/python -m pip install -q -e '.[test]'", f"{venv}/bin/buun vendor",
                 f"{venv}/bin/buun patch", f"{venv}/bin/buun build --cpu", f"{venv}/bin/ruff check .",
                 f"{venv}/bin/python -m pytest -q"):
        assert step in commands, step
    installs = [line.strip() for line in commands.splitlines() if "pip install" in line]
    assert installs and all(line.startswith(f"{venv}/bin/python -m pip") for line in installs), installs


def test_the_readme_installs_into_a_virtual_environment() -> None:
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    assert "python3 -m venv .venv" in install and ".venv/bin/pip install -e ." in install
    assert not re.search(r"^\s*(python3 -m )?pip3? install", readme, re.M)  # never into the system Python
    dev = (ROOT / "docs" / "development.md").read_text()
    assert "about 6 min" in dev and "| `make check` |" in dev  # what `make dev` and each tier take
