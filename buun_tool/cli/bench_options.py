"""The options of `buun bench`, defined once (cli/measure.py's bench_cmd takes them in this order;
measure/bench_request.py checks them)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

Against = Enum("Against", {"upstream": "upstream"}, type=str)  # bench --against: the builds beside buun's

TargetOpt = Annotated[Path | None, typer.Option("--target", help="Target GGUF (default: the synthetic pair).",
                                                show_default=False)]
DrafterOpt = Annotated[Path | None, typer.Option("--drafter", help="DFlash drafter GGUF.", show_default=False)]
RecipeModelsOpt = Annotated[bool, typer.Option(
    "--recipe-models", help="Bench the recipe's own models, the pair `buun setup` pulled and converted into "
    "--models-dir (what `buun serve` serves), on their real acceptance.")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Benchmark this running llama-server instead.",
                                            show_default=False)]
SuiteOpt = Annotated[str, typer.Option("--suite", help="Comma-separated: code, math, prose, and long (prompts of "
                                      "about 8K and 30K tokens, -c sized to fit; only when named).")]
ModeOpt = Annotated[str, typer.Option(
    "--mode", help="Forms of request: raw (/completion), chat (/v1/chat/completions), chat-nothink (the chat "
    "template with enable_thinking off), chat-sampled (temperature 0.7, top-p 0.95, seeded); comma-separated.")]
PromptsOpt = Annotated[int, typer.Option("--prompts", min=0, help="Prompts per suite (0: all).")]
NPredictOpt = Annotated[int, typer.Option("--n-predict", min=1, help="Tokens generated per request.")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", min=1, help="Requests per prompt.")]
SyntheticAlOpt = Annotated[list[float] | None, typer.Option(
    "--synthetic-al", help="Force a mean acceptance length with --spec-synth-len (repeatable: one DFlash "
    "server each). Measures step cost on random weights.", show_default=False)]
AlSweepOpt = Annotated[bool, typer.Option("--al-sweep", help="Add DFlash servers at synthetic AL 1, 2, ..., 10: "
                                          "the report's tok/s against AL.")]
TreeBudgetsOpt = Annotated[str | None, typer.Option(
    "--tree-budget", metavar="N,N,...", help="Sweep the DDTree budget: one DFlash server per budget and the "
    "chain (0), on buun synth's random weights with the calibrated synthetic tree profile (--spec-synth-tree), "
    "on real models with the drafter's own acceptance (needs patch 0023): the fastest budget, and the "
    "report's tok/s and AL against the budget.", show_default=False)]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", metavar="N,N,...", help="Also send N requests at once to each AR and chain DFlash "
    "configuration on a server of N slots: per-request and aggregate tok/s, against one slot and against "
    "AR at N.", show_default=False)]
NoArOpt = Annotated[bool, typer.Option("--no-ar", help="Skip the autoregressive baseline.")]
UntunedOpt = Annotated[bool, typer.Option(
    "--untuned", help="DFlash servers run the recipe's settings, not the tune of these models on this card "
    "(`buun tune`), which they run by default under the options given here.")]
AgainstOpt = Annotated[Against | None, typer.Option(
    "--against", help="Also run every configuration on unpatched llama.cpp (`buun build --upstream` builds "
    "it), in its spellings and without -cd: both rows, and buun's tok/s over upstream's.",
    show_default=False)]
CtxOpt = Annotated[int, typer.Option("--ctx", min=1, help="llama-server -c of every server (bench pins it; the "
                                     "recipe's `fit` depends on the card).")]
DraftMaxOpt = Annotated[int | None, typer.Option("--draft-max", min=0, help="Replaces the recipe's --draft-max.",
                                                 show_default=False)]
HostSamplingOpt = Annotated[bool, typer.Option("--host-sampling", help="Sample on the host: drops the recipe's "
                                               "--backend-sampling.")]
LongTokensOpt = Annotated[str, typer.Option("--long-tokens", help="The long suite's prompt sizes in tokens, each cut "
                                            "to that many tokens of the server's own tokenizer.")]
ServerArgsOpt = Annotated[str, typer.Option("--server-args", help="llama-server flags for every server, as one "
                                            "string, replacing the recipe's of the same option as `buun serve -- "
                                            "FLAGS` does: --server-args '-t 8'.")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Folder for the JSON, PNG and server logs.",
                                             show_default=False)]
LoadTimeoutOpt = Annotated[float, typer.Option("--load-timeout", help="Seconds a server may take to load.")]
ReportOpt = Annotated[bool, typer.Option("--report", help="Also write report.html: one self-contained HTML file "
                                         "with every chart and table (needs matplotlib).")]
ReportFromOpt = Annotated[Path | None, typer.Option("--report-from", help="Write the HTML report of a recorded "
                                                    "bench.json (into --out, default its folder); runs nothing.",
                                                    show_default=False)]
CompareOpt = Annotated[tuple[Path, Path] | None, typer.Option("--compare", help="Two recorded bench.json files: "
                                                              "side by side, differences beyond their noise "
                                                              "flagged; runs nothing.", show_default=False)]
BandwidthOpt = Annotated[float | None, typer.Option("--bandwidth-gbs", help="The card's memory bandwidth (GB/s) "
                                                    "for the report's bound (default: the datasheet's, for "
                                                    "known cards).", show_default=False)]
