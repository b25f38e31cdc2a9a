"""Where a recipe's models lie in a models folder: one place that knows it, for every stage that
reads or writes them (pull, drafter, convert) and for the server that loads them.

Every repo lands in `models_dir/<role>/<owner>--<name>/`; the converted drafter and its provenance
record in `models_dir/gguf/<recipe>/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from buun_tool.formats.recipes import Recipe


@dataclass(frozen=True)
class Layout:
    """The on-disk places of one recipe's models."""

    root: Path
    target_dir: Path
    drafter_dir: Path
    tokenizer_dir: Path
    target_gguf: Path
    gguf_dir: Path  # the converted drafter and its provenance record
    drafter_stem: str
    quant: str

    def role_dir(self, role: str) -> Path:
        return {"target": self.target_dir, "drafter": self.drafter_dir, "tokenizer": self.tokenizer_dir}[role]

    def drafter_gguf(self, quant: str | None = None) -> Path:
        """The converted drafter: the recipe's quant, or another type (F16, BF16) when given."""
        return self.gguf_dir / f"{self.drafter_stem}-{(quant or self.quant).upper()}.gguf"


def repo_folder(repo: str) -> str:
    return repo.replace("/", "--")


def for_recipe(recipe: Recipe, models_dir: Path) -> Layout:
    """Where `recipe`'s models lie in `models_dir` (the folder the command resolved: paths.models_dir)."""
    root = models_dir
    dirs = {role: root / role / repo_folder(spec.repo) for role, spec in recipe.repos().items()}
    return Layout(
        root=root,
        target_dir=dirs["target"],
        drafter_dir=dirs["drafter"],
        tokenizer_dir=dirs["tokenizer"],
        target_gguf=dirs["target"] / recipe.target_gguf,
        gguf_dir=root / "gguf" / recipe.name,
        drafter_stem=recipe.drafter.repo.split("/")[1],
        quant=recipe.quantize,
    )
