"""Recorded `buun bench` runs (tests/data/bench) and helpers for the tests that read them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from buun_tool.cli.app import app

# copies of H100/H200 runs' bench.json (docs/results/h100-2026-11-27-pdl, -targets and h200-2026-11-26)
DATA = Path(__file__).resolve().parents[1] / "data" / "bench"
RECORDED = DATA / "recorded.json"  # format 1: before the report
TWIN = DATA / "twin.json"  # the same configurations as RECORDED
OTHER_CONFIGS = DATA / "other-configs.json"  # no AR row
REPO = Path(__file__).resolve().parents[2]
# the python of the tests with matplotlib made unimportable, as on a machine without the bench extra
NO_MATPLOTLIB = [sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
                 "from buun_tool.cli.app import main; sys.argv[0] = 'buun'; main()"]


# A string a crafted bench.json puts everywhere the report shows one: a quote and `>` to break out of
# an attribute, a script, an event handler, rich markup, and a terminal escape and a `$` pair
# matplotlib read as mathtext.
HOSTILE = '"\'><script>alert(1)</script><img src=x onerror=alert(2)>[/]\x1b]0;title\x07$\\frac{$'


def crafted_run() -> dict[str, Any]:
    """RECORDED with HOSTILE in every string the report or --compare shows."""
    data = json.loads(RECORDED.read_text())
    for item in (*data["summary"], *data["samples"]):
        item["suite"], item["mode"] = HOSTILE, HOSTILE + "m"
    for item in (*data["summary"], *data["configs"]):
        item["label"] = HOSTILE + item["label"]
    data["machine"].update(cpu=HOSTILE, hostname=HOSTILE, gpus=[{**data["machine"]["gpus"][0], "name": HOSTILE}])
    data["machine"][HOSTILE] = HOSTILE
    data["llama_cpp"].update(pin=HOSTILE, version=[HOSTILE], build={HOSTILE: HOSTILE})
    data["commands"] = {**{name: [HOSTILE, *argv] for name, argv in data["commands"].items()}, HOSTILE: [HOSTILE]}
    data["options"].update(models_note=HOSTILE, env={HOSTILE: HOSTILE})
    data["created"], data["prompt_sources"] = HOSTILE, {HOSTILE: HOSTILE}
    data["prompts"] = [{"suite": HOSTILE, "id": HOSTILE, "text": HOSTILE}]
    return data


def bench_cli(*args: str) -> Any:
    """`buun bench ARGS` in-process."""
    return CliRunner().invoke(app, ["bench", *args])


def said(text: str) -> str:
    """What the CLI printed, with rich's line wrapping undone."""
    return " ".join(text.split())


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def tree_sweep_run() -> dict[str, Any]:
    """A run as `buun bench --synthetic-al 1 --synthetic-al 7.67 --tree-budget 8,16,22,32` writes it
    (bench's own configs, argv, summary and JSON), on RECORDED's machine, prompts and build, with
    made-up timings: each sweep point accepts what the profile expects, less 2%, and its step costs
    0.6% more per node past 16, from 18 ms; AR decodes at 80 tok/s. Every chart of the report is there."""
    from buun_tool.formats import recipes
    from buun_tool.measure import bench, bench_configs

    rec = json.loads(RECORDED.read_text())
    recipe, common = recipes.load(), bench_configs.common(draft_max=15)
    tree = bench_configs.tree_configs(bench_configs.tree_budgets("8,16,22,32"), recipe, common, Path("/m"))
    models = bench_configs.Models(Path("/m/t.gguf"), Path("/m/d.gguf"))
    runs = []
    for i, cfg in enumerate(bench_configs.configs(True, [1.0, 7.67], tree)):
        argv = bench_configs.argv(recipe, cfg, models, Path("/b/llama-server"), 9000 + i, common, Path("/m"))
        al = cfg.expected_al * 0.98 if cfg.expected_al else cfg.synthetic_al
        step_ms = 18.0 * (1 + 0.006 * max((cfg.tree_budget or 0) - 16, 0)) if cfg.spec else 12.5
        samples = [_sample(cfg.name, pid, al, step_ms) for pid in ("code/fib", "code/quicksort")]
        runs.append(bench.ConfigRun(cfg, argv, 16379 + 1232 * cfg.spec, 0, samples))
    result = bench.BenchResult(rec["created"], rec["machine"], rec["llama_cpp"], rec["options"],
                               rec["prompt_sources"], runs, prompts=[bench.Prompt(**p) for p in _code_prompts()])
    result.rows = bench.summarize(runs)
    return result.to_json()


def _sample(config: str, prompt_id: str, al: float | None, step_ms: float) -> Any:
    """512 tokens decoded in steps of `al` tokens (None: AR, one token a step), per-position acceptance
    falling geometrically."""
    from buun_tool.measure import bench

    steps = round(512 / (al or 1))
    accepted = 512 - steps if al else 0
    per_pos = [steps * (1 - 1 / al) ** (k + 1) for k in range(15)] if al else []
    return bench.Sample(config, "code", "raw", prompt_id, 0, 75, 235.0, 512, steps * step_ms, 240.0,
                        drafted=15 * steps if al else 0, accepted=accepted, steps=steps if al else 0,
                        accepted_per_pos=per_pos)


def _code_prompts() -> list[dict[str, str]]:
    rows = map(json.loads, (REPO / "buun_tool/data/prompts/code.jsonl").read_text().splitlines())
    return [{"suite": "code", "id": r["id"], "text": r["prompt"]} for r in rows if r["id"] in ("code/fib",
                                                                                                 "code/quicksort")]
