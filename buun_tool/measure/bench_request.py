"""`buun bench`'s options as one request, checked against each other when it is made (no typer
needed: the tests make one as the command does), and which of the command's three jobs it asks for.

    BenchRequest(suite="code", url="http://...", ...)   UsageError for options that do not go together
    request.job                                          "run", "report" (--report-from) or "compare" (--compare)

Each field is the option of its name as given; `suites`, `modes`, `tree_budgets` and `levels` are
--suite, --mode, --tree-budget and --concurrency parsed (a run's only: a report or a comparison
runs nothing and reads none of them), and `long_sizes` --long-tokens. With the `long` suite, a
--ctx left at its default becomes the context its prompts need (bench_long.context_for).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from buun_tool.base import command
from buun_tool.base.errors import UsageError
from buun_tool.formats import recipes
from buun_tool.measure import bench_configs, bench_long
from buun_tool.measure.bench_prompts import ALL_MODES, ALL_SUITES, MODES, SUITES
from buun_tool.pipeline import build

Job = Literal["run", "report", "compare"]


@dataclass(frozen=True)
class BenchRequest:
    """What `buun bench` was asked; the defaults are the command's."""

    recipe: str | None = None
    target: Path | None = None
    drafter: Path | None = None
    recipe_models: bool = False
    scale: str | None = None
    models_dir: Path | None = None
    url: str | None = None
    suite: str = ",".join(SUITES)
    mode: str = ",".join(MODES)
    prompts: int = 4  # per suite; 0: all
    n_predict: int = 256
    repeats: int = 1
    synthetic_al: tuple[float, ...] = ()
    al_sweep: bool = False
    tree_budget: str | None = None
    concurrency: str | None = None
    gpus: str | None = None
    draft_gpu: int | None = None
    rpc: str | None = None
    no_ar: bool = False
    untuned: bool = False  # leave out the tune of these models on this card (server/tuned.py)
    against: str | None = None  # "upstream": every configuration on unpatched llama.cpp too
    ctx: int = bench_configs.DEFAULT_CTX
    draft_max: int | None = None
    host_sampling: bool = False
    server_args: str = ""
    long_tokens: str = ",".join(map(str, bench_long.SIZES))
    out: Path | None = None
    load_timeout: float = 300.0
    report: bool = False
    report_from: Path | None = None
    compare: tuple[Path, Path] | None = None
    bandwidth_gbs: float | None = None
    json_out: bool = False
    # parsed when the request is made
    suites: tuple[str, ...] = field(init=False, default=())
    modes: tuple[str, ...] = field(init=False, default=())
    tree_budgets: tuple[int, ...] = field(init=False, default=())
    levels: tuple[int, ...] = field(init=False, default=())
    long_sizes: tuple[int, ...] = field(init=False, default=bench_long.SIZES)

    @property
    def job(self) -> Job:
        return "report" if self.report_from else "compare" if self.compare else "run"

    def __post_init__(self) -> None:
        if self.report_from and self.compare:
            raise UsageError("--report-from and --compare are two different commands: pass one of them")
        if self.bandwidth_gbs is not None and self.bandwidth_gbs <= 0:
            raise UsageError(f"--bandwidth-gbs {self.bandwidth_gbs:g}: expected the card's memory bandwidth in GB/s, "
                             "for example 936 for an RTX 3090")
        if self.job == "run":
            self._check_run()

    def _check_run(self) -> None:
        """A run's options, in the order the command has always said them: before anything is made
        (a misspelt suite was refused only after buun synth wrote the pair)."""
        url = self.url
        self._set(suites=_csv(self.suite, ALL_SUITES, "--suite"), modes=_csv(self.mode, ALL_MODES, "--mode"))
        self._set(long_sizes=bench_long.parse_sizes(self.long_tokens))
        if bench_long.SUITE in self.suites and not url:
            self._size_context()
        if self.against and url:
            raise UsageError("--against runs its own servers on both builds; --url measures one running server",
                             "leave out one of them")
        if self.against:
            build.find_upstream_binary("llama-server")  # before the models are made: say what to build first
        if self.tree_budget is not None and url:
            raise UsageError("--tree-budget sweeps servers buun starts itself; --url measures one running server",
                             "leave out --url (the synthetic pair is the default), or --tree-budget")
        if self.tree_budget is not None:
            self._set(tree_budgets=tuple(bench_configs.tree_budgets(self.tree_budget)))
        if self.concurrency is not None:
            self._set(levels=tuple(_levels(self.concurrency)))
        if self.levels and url:
            raise UsageError("--concurrency starts servers of N slots itself; --url measures one running server",
                             "leave out --url (the synthetic pair is the default), or --concurrency")
        if self.rpc and url:
            raise UsageError("--rpc starts servers split over the workers; --url measures one running server",
                             "leave out one of them")

    def _size_context(self) -> None:
        """A --ctx left at its default becomes what the long prompts asked for need; less is refused."""
        sizes = self.long_sizes[:self.prompts] if self.prompts else self.long_sizes
        need = bench_long.context_for(sizes, self.n_predict)
        if self.ctx == bench_configs.DEFAULT_CTX:
            self._set(ctx=need)
        elif self.ctx < need:
            raise UsageError(f"--ctx {self.ctx}: the long suite's prompts and {self.n_predict} tokens of answer need "
                             f"-c {need}", f"leave out --ctx (the bench sizes it), or pass --ctx {need} or more")

    def _set(self, **parsed: Any) -> None:
        for name, value in parsed.items():
            object.__setattr__(self, name, value)  # frozen: set once, while the request is made


def _csv(value: str, valid: tuple[str, ...], option: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in items if v not in valid]
    if bad or not items:
        raise UsageError(f"{option} {value!r}: expected a comma-separated list of {', '.join(valid)}")
    return items


def _levels(value: str) -> list[int]:
    """--concurrency 2,4: requests at once, each level servers of that many slots."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(command.is_count(v) and 1 <= int(v) <= recipes.MAX_SLOTS for v in items):
        raise UsageError(f"--concurrency {value!r}: expected a comma-separated list of request counts, "
                         f"1 to {recipes.MAX_SLOTS}", "for example --concurrency 4, or --concurrency 2,4,8")
    return [int(v) for v in items]
