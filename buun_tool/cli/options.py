"""Options that command groups share, defined once.

`--models-dir` is taken by every command that reads or writes models. The command resolves it
once (`paths.models_dir`: the option, else BUUN_MODELS_DIR, else the XDG data dir) and passes
the folder down; nothing below the command resolves it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelsDirOpt = Annotated[Path | None, typer.Option(
    "--models-dir", show_default=False,
    help="Where models live (default: BUUN_MODELS_DIR, else ~/.local/share/buun/models).")]
