"""`buun setup`: every stage in order, resumable, ending with a served and smoke-tested model.

Setup keeps no record of its own: it orders the stages and asks each for its status (stage.py),
which the stage answers from its own records (the tree and the pin, the series in the tree, the
build stamp, the manifests, the drafter folder, the GGUF's provenance), so setup, the dry-run
plan and the stage's own command always agree. A current stage is skipped; a stale one runs, and
the plan says why. Stages are atomic on their own (vendor and convert rename finished work into
place, pull resumes partial files), so a run killed anywhere completes when started again. The
doctor and serve run every time (serve is a no-op when the same server already runs). The
downloads run beside the build (BESIDE; side_by_side.py runs the two lanes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import requests

from buun_tool.app import tune as tune_app
from buun_tool.app.downloads import Downloads
from buun_tool.app.side_by_side import side_by_side
from buun_tool.base import console, nvidia
from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.formats import layout
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import build, doctor, drafter, patches, pull, vendor
from buun_tool.pipeline import convert as convert_stage
from buun_tool.pipeline.stage import StageStatus, current, stale
from buun_tool.plan import fit
from buun_tool.server import control, instance
from buun_tool.server import spec as spec_mod
from buun_tool.server.state import State

SMOKE_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
SMOKE_TOKENS = 128


@dataclass
class Context:
    recipe: Recipe
    models_dir: Path  # resolved once by the command (paths.models_dir): every stage uses this folder
    cpu: bool = False
    host: str = spec_mod.DEFAULT_HOST
    port: int = spec_mod.DEFAULT_PORT
    api_key: str | None = None
    no_api_key: bool = False  # serve beyond loopback without a key, on purpose
    extra: list[str] = field(default_factory=list)  # llama-server flags overriding the recipe's
    verbose: bool = False  # stages name what they did one by one (the patch stage: each patch)
    downloads: Downloads | None = None  # the pull's progress while it runs beside the build (else pull's own)
    tune: bool = True  # --no-tune: serve the recipe's settings (or an earlier tune's), measure nothing

    @property
    def layout(self) -> layout.Layout:
        return layout.for_recipe(self.recipe, self.models_dir)


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    run: Callable[[Context], Any]
    # the stage's own answer from its own records; None: the stage runs every time
    status: Callable[[Context], StageStatus] | None = None
    # earlier stages whose work changes this one's inputs: when one of them runs, so does this
    # one (what the dry run cannot ask the stage before that work is done)
    after: tuple[str, ...] = ()


# --- the stages -----------------------------------------------------------------------------

def _doctor(ctx: Context) -> None:
    detected = nvidia.detect_gpus()  # once: doctor's GPU lines and the memory check read the same answer
    checks = doctor.run_checks(ctx.recipe, ctx.models_dir, cpu_only=ctx.cpu, gpus=detected)
    failed = [c for c in checks if c.failed]
    if failed:
        raise BuunError("the machine is not ready:\n  " + "\n  ".join(f"{c.name}: {c.detail}" for c in failed),
                        "; ".join(c.fix for c in failed if c.fix) or "run `buun doctor` for details",
                        exit_code=Exit.NOT_READY)
    gpus = [] if ctx.cpu else detected
    if gpus:
        _check_gpu_memory(ctx, gpus[0])
    if not pull.stage_status(ctx.recipe, ctx.models_dir).current:
        pull.check_hub(ctx.recipe, ctx.models_dir)  # before the build, not after it
    console.ok("doctor: the required checks pass" + ("" if gpus else " (no GPU: CPU build)"))


def _check_gpu_memory(ctx: Context, gpu: nvidia.Gpu) -> None:
    """Before any download: would the recipe's server fit this GPU at all?"""
    flags = fit.flags_from_recipe(ctx.recipe)
    need = fit.predict(ctx.recipe, flags)
    gib = gpu.memory_mib / 1024
    if fit.fits(need, gib, margin_gib=0.25):
        return
    best = fit.max_context(ctx.recipe, flags, gib)
    hint = (f"the largest context that fits is -c {best}: pass `-- -c {best}` or a smaller KV cache type "
            f"(`-- -ctk q8_0 -ctv q8_0`); `buun fit {ctx.recipe.ref} --gpu-mem {gib:.0f}` shows the options"
            if best else f"`buun fit {ctx.recipe.ref} --gpu-mem {gib:.0f}` shows what would fit")
    raise BuunError(f"{ctx.recipe.name} needs about {need.total / 2**30:.1f} GiB of GPU memory with its settings; "
                    f"{gpu.name} has {gib:.1f} GiB", hint, exit_code=Exit.NOT_READY)


def _patch(ctx: Context) -> None:
    console.ok(patches.describe_applied(patches.apply(), ctx.verbose))


def _server_args(ctx: Context) -> list[str]:
    """llama-server's arguments beyond the recipe's: a CPU setup offloads no layer, then the
    user's own flags (after `--`), which win."""
    return [*(("-ngl", "0", "-ngld", "0") if ctx.cpu else ()), *ctx.extra]


def _resolve(ctx: Context, need_models: bool = True,
             cpu_build: bool | None = None) -> tuple[spec_mod.LaunchSpec, str | None]:
    """The launch of the serve stage, for the run and for the plan alike."""
    return spec_mod.resolve(str(ctx.recipe.source), models_dir=ctx.models_dir, host=ctx.host, port=ctx.port,
                            extra=_server_args(ctx), api_key=ctx.api_key, no_api_key=ctx.no_api_key,
                            need_models=need_models, cpu_build=cpu_build)


def _tune_status(ctx: Context) -> StageStatus:
    if not ctx.tune:
        return current("--no-tune")
    return tune_app.stage_status(ctx.recipe, ctx.models_dir)


def _tune(ctx: Context) -> tune_app.Outcome:
    """`buun tune` with its defaults. A server of this recipe still running (an earlier setup's)
    would share the card with every measured one: it is stopped, and the serve stage starts it
    again with the pick."""
    inst = tune_app.serving(ctx.recipe)
    if inst is not None:
        console.step(f"stopping {inst.name} while the tune measures")
        control.stop(inst)
    outcome = tune_app.tune(tune_app.prepare(ctx.recipe, ctx.models_dir))
    console.ok(f"tune: {outcome.tuned.note}")
    return outcome


def _serve(ctx: Context) -> spec_mod.LaunchSpec:
    spec, key = _resolve(ctx)
    ctx.api_key = key  # the smoke test's and the summary's: also one after `--` or in the recipe
    inst = instance.Instance(spec.name)
    state = control.status(inst, key).state
    if state == State.READY and _same_launch(inst, spec):
        console.ok(f"{spec.name} is already running: {spec.url}")
        return spec
    if state not in (State.STOPPED, State.FAILED):
        console.step(f"{spec.name} runs with other settings: restarting it")
        control.stop(inst)
    console.step(f"starting {spec.name} on {spec.url}")
    control.launch(spec, key, progress=lambda text: console.info(f"    {text}"))
    console.ok(f"{spec.name} is ready: {spec.url}")
    return spec


def _same_launch(inst: instance.Instance, spec: spec_mod.LaunchSpec) -> bool:
    running = inst.read_spec()
    return bool(running) and spec_mod.LaunchSpec.from_json(running).argv == spec.argv


def _build_plan(ctx: Context) -> build.BuildPlan:
    return build.plan(cpu=ctx.cpu)


def _pull(ctx: Context) -> pull.PullResult:
    bar = ctx.downloads
    return pull.pull(ctx.recipe, ctx.models_dir, bar=bar, on_plan=bar.planned if bar else None)


STAGES: tuple[Stage, ...] = (
    Stage("doctor", "check the OS, GPU, toolchain, disk, GPU memory and that the Hub answers", _doctor),
    Stage("vendor", "fetch the pinned llama.cpp into vendor/llama.cpp", lambda ctx: vendor.vendor(),
          status=lambda ctx: vendor.stage_status()),
    Stage("patch", "apply the patch series", _patch, status=lambda ctx: patches.stage_status(), after=("vendor",)),
    Stage("build", "build llama.cpp", lambda ctx: build.build(_build_plan(ctx)),
          status=lambda ctx: build.stage_status(_build_plan(ctx)), after=("vendor", "patch")),
    Stage("pull", "download the target GGUF, the drafter and the tokenizer", _pull,
          status=lambda ctx: pull.stage_status(ctx.recipe, ctx.models_dir)),
    Stage("drafter", "copy the tokenizer files into the drafter folder",
          lambda ctx: drafter.prepare(ctx.recipe, ctx.models_dir),
          status=lambda ctx: drafter.stage_status(ctx.recipe, ctx.models_dir), after=("pull",)),
    Stage("convert", "convert the drafter to GGUF, quantize and verify it",
          lambda ctx: convert_stage.convert(ctx.recipe, ctx.models_dir),
          status=lambda ctx: convert_stage.stage_status(ctx.recipe, ctx.models_dir),
          after=("pull", "drafter", "build")),
    Stage("tune", "measure AR, the chain and trees on this card and keep the fastest (buun tune)", _tune,
          status=_tune_status, after=("build", "pull", "drafter", "convert")),
    Stage("serve", "start the supervised llama-server and wait until it is ready", _serve),
)

# Two lanes that run side by side, in place of their stretch of STAGES: the downloads (pull, then
# drafter, which needs nothing but pull) need nothing of vendor -> patch -> build, so a user waits
# for the longer of the two (~17 GB; 10-20 minutes), not for their sum. The build's lane runs in
# the main thread, the downloads' in a process of its own (side_by_side.py says why); convert, the
# next stage, needs both and starts when both are done. Every other stage runs alone, in STAGES'
# order: a stage added after convert needs no change here.
BESIDE: tuple[tuple[str, ...], tuple[str, ...]] = (("vendor", "patch", "build"), ("pull", "drafter"))


# --- the smoke test and the summary ---------------------------------------------------------

@dataclass
class Smoke:
    tokens: int
    seconds: float
    tok_per_s: float
    drafted: int
    accepted: int

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def smoke(url: str, api_key: str | None = None) -> Smoke:
    """One completion through the server: proves it answers, and measures decode speed and DFlash
    acceptance (on real weights; random synthetic weights accept nothing)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"prompt": SMOKE_PROMPT, "n_predict": SMOKE_TOKENS, "temperature": 0.0, "cache_prompt": False}
    try:
        r = requests.post(f"{url}/completion", json=body, headers=headers, timeout=600)
    except requests.RequestException as exc:
        raise BuunError(f"the smoke completion to {url} failed: {exc}", "see `buun logs`") from None
    if r.status_code != 200:
        raise BuunError(f"the smoke completion got HTTP {r.status_code}: {r.text[:300]}", "see `buun logs`")
    t = r.json().get("timings", {})
    return Smoke(int(t.get("predicted_n", 0)), float(t.get("predicted_ms", 0)) / 1000,
                 float(t.get("predicted_per_second", 0.0)), int(t.get("draft_n", 0)),
                 int(t.get("draft_n_accepted", 0)))


def summary(spec: spec_mod.LaunchSpec, result: Smoke, has_key: bool = False) -> str:
    acc = f"{result.acceptance:.0%} of {result.drafted} drafted tokens accepted" if result.acceptance is not None \
        else "no draft tokens"
    return "\n".join([
        f"[bold green]buun is serving {spec.recipe}[/]",
        f"  endpoint     {spec.url}  (web chat: {spec.url}/, OpenAI API: {spec.url}/v1)",
        f"  target       {spec.target}",
        f"  drafter      {'none: the tune measured AR faster on this card' if spec.serves_ar else spec.draft}",
        f"  smoke test   {result.tokens} tokens at {result.tok_per_s:.1f} tok/s, {acc}",
        *([f"  tuned        {spec.tuned}"] if spec.tuned else []),
        f"  command      {spec.launch().display()}",
        "",
        "  curl:",
        f"    curl {spec.url}/v1/chat/completions -H 'Content-Type: application/json' \\"
        + (" -H 'Authorization: Bearer <your key>' \\" if has_key else ""),
        "      -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Write quicksort in Python\"}]}'",
        "  Python (pip install openai):",
        "    from openai import OpenAI",
        f"    client = OpenAI(base_url=\"{spec.url}/v1\", api_key=\"{'<your key>' if has_key else 'none'}\")",
        "    r = client.chat.completions.create(model=\"buun\", messages=[{\"role\": \"user\", \"content\": \"hi\"}])",
        "    print(r.choices[0].message.content)",
        "",
        f"  manage it with `buun status`, `buun logs -f`, `buun stop {spec.name}`",
    ])


# --- the plan and the run -------------------------------------------------------------------

@dataclass(frozen=True)
class PlanRow:
    stage: str
    action: str  # skip | run | check
    what: str
    detail: str = ""


def _download_detail(ctx: Context) -> str:
    """Bytes still to download, asked of the Hub (the dry run must not fail when it is unreachable)."""
    from huggingface_hub import HfApi, get_token

    try:
        token = get_token()
        api = HfApi(endpoint=pull.hub_endpoint(), token=token)
        plans = [pull.plan_repo(api, ctx.recipe, role, ctx.layout.role_dir(role), token, False)
                 for role in pull.ROLES]
    except BuunError as exc:
        return f"sizes unknown: {exc.message.splitlines()[0]}"
    files = sum(len(p.to_fetch) for p in plans)
    return f"{files} file(s), {pull.bytes_needed(plans) / 2**30:.2f} GiB to download"


def _what(ctx: Context, stage: Stage) -> str:
    if stage.name == "build":
        p = _build_plan(ctx)
        return f"build llama.cpp for the {'GPU (CUDA, sm_' + str(p.arch) + ')' if p.variant == 'cuda' else 'CPU'}"
    return stage.what


def _stage_row(ctx: Context, stage: Stage, running: list[str]) -> PlanRow:
    """A stage's own answer, unless an earlier stage that changes its inputs runs first."""
    assert stage.status is not None
    first = [name for name in stage.after if name in running]
    status = stale(f"{' and '.join(first)} run(s) first") if first else stage.status(ctx)
    detail = status.detail
    if stage.name == "pull" and not status.current:
        detail += f"; {_download_detail(ctx)}"
    return PlanRow(stage.name, "skip" if status.current else "run", _what(ctx, stage), detail)


def _serve_row(ctx: Context, stage: Stage, argv: list[str], shown: str) -> PlanRow:
    """`shown`: the command as the plan prints it (the API key masked)."""
    inst = instance.Instance(ctx.recipe.name)
    running = inst.read_spec()
    same = (control.status(inst).state == State.READY and bool(running)
            and spec_mod.LaunchSpec.from_json(running).argv == argv)
    return PlanRow(stage.name, "skip" if same else "run",
                   f"{ctx.recipe.name} is already running with this command" if same else stage.what, shown)


def _serves_a_cpu_build(ctx: Context, binary: Path) -> bool:
    """Whether the server this setup starts is a CPU build's: the build its build stage makes
    (a CPU build found now is replaced by the CUDA one where nvcc is), unless the binaries are
    pinned elsewhere (build.bin_dir's override)."""
    if build.bin_dir_pinned():
        return build.variant_of(binary) == "cpu"
    return _build_plan(ctx).variant == "cpu"


def plan(ctx: Context) -> list[PlanRow]:
    """What `run` would do, stage by stage: the same checks, nothing changed."""
    # the launch the serve stage will resolve, from the same function (its models may not exist
    # yet), so that it compares equal to the command of a server that runs
    binary, _ = spec_mod.server_binary(built=False)
    spec, key = _resolve(ctx, need_models=False, cpu_build=_serves_a_cpu_build(ctx, binary))
    rows: list[PlanRow] = []
    for stage in STAGES:
        if stage.name == "serve":
            rows.append(_serve_row(ctx, stage, spec.argv, spec.launch().display(key)))
        elif stage.status is None:
            rows.append(PlanRow(stage.name, "check", stage.what + (" (CPU: no CUDA needed)" if ctx.cpu else "")))
        else:
            rows.append(_stage_row(ctx, stage, [r.stage for r in rows if r.action == "run"]))
    return _beside(rows)


def _beside(rows: list[PlanRow]) -> list[PlanRow]:
    """The downloads that will run while vendor, patch or build do say so."""
    building = [r.stage for r in rows if r.stage in BESIDE[0] and r.action == "run"]
    if not building:
        return rows
    return [replace(r, what=f"{r.what} (at the same time as {', '.join(building)})")
            if r.stage in BESIDE[1] and r.action == "run" else r for r in rows]


class Declined(Exception):
    """The user answered no at setup's prompt: a choice, not an error; no stage has run."""


def _confirm(ctx: Context, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("buun setup downloads models and builds llama.cpp; in a non-interactive shell pass --yes")
    import typer

    if not typer.confirm(f"Set up {ctx.recipe.name} (downloads ~{doctor.disk_needed(ctx.recipe) / 2**30:.0f} GiB "
                         "with the build and conversion)?", default=True):
        raise Declined


def run(ctx: Context, yes: bool = False) -> tuple[spec_mod.LaunchSpec, Smoke]:
    _confirm(ctx, yes)
    spec = run_stages(ctx)["serve"]
    assert spec is not None
    console.step("smoke test: one completion through the server")
    return spec, smoke(spec.url, ctx.api_key)


def run_stages(ctx: Context, stages: tuple[Stage, ...] = STAGES) -> dict[str, Any]:
    """Every stage at its turn, the lanes of BESIDE side by side; what each returned, by name (None:
    skipped)."""
    results: dict[str, Any] = {}
    lanes = [[s for s in stages if s.name in lane] for lane in BESIDE]
    for stage in stages:
        if stage.name in results:
            continue
        if not any(stage in lane for lane in lanes):
            results[stage.name] = _run_stage(ctx, stage)
            continue
        results.update((s.name, None) for s in (*lanes[0], *lanes[1]))  # they run now, together
        ctx.downloads = Downloads()
        try:
            results.update(side_by_side(*[[(s.name, partial(_run_stage, ctx, s)) for s in lane] for lane in lanes],
                                        ctx.downloads))
        finally:
            ctx.downloads = None
    return results


def _run_stage(ctx: Context, stage: Stage) -> Any:
    # asked at its turn: the stages before it (in its lane, and those before the lanes) have done their work
    status = stage.status(ctx) if stage.status else None
    if status is not None and status.current:
        console.ok(f"{stage.name}: current, skipped ({status.detail})")
        return None
    console.step(f"{stage.name}: {stage.what}" + (f" ({status.detail})" if status else ""))
    return stage.run(ctx)
