"""`buun setup`: every stage in order, resumable, ending with a served and smoke-tested model.

Each stage records its completion with a stamp of its inputs (`paths.stamps_dir()`); a re-run
skips a stage whose inputs are unchanged and whose outputs are still there, and redoes one whose
inputs changed (a new pin, patch, recipe revision). Stages are atomic on their own (vendor and
convert rename finished work into place, pull resumes partial files, build has its own stamp),
so a run killed anywhere completes when started again. The cheap, self-checking stages (doctor,
build, serve) run every time: each is a no-op in about a second when nothing changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from buun_tool import build, console, doctor, drafter, fit, patches, paths, pull, vendor
from buun_tool import convert as convert_stage
from buun_tool.errors import BuunError, Exit, NotReadyError, UsageError
from buun_tool.fsutil import write_json_atomic
from buun_tool.recipes import Recipe
from buun_tool.server import command, control, instance
from buun_tool.server import spec as spec_mod

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

    @property
    def layout(self) -> pull.Layout:
        return pull.layout(self.recipe, self.models_dir)


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    run: Callable[[Context], Any]
    # stamped stages: the inputs that decide whether the stage must run again, and a cheap check
    # that its outputs are still in place; None = the stage runs every time (it is its own no-op)
    inputs: Callable[[Context], dict[str, Any]] | None = None
    done: Callable[[Context], bool] | None = None
    # without a matching stamp: whether the work is done all the same, by another route (`buun
    # patch`, `make dev`, a `buun convert` of its own), judged from the outputs themselves
    current: Callable[[Context], bool] | None = None


# --- stamps ---------------------------------------------------------------------------------

def _stamp_file(ctx: Context, stage: str) -> Path:
    return paths.stamps_dir() / ctx.recipe.name / f"{stage}.json"


def _digest(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def is_done(stage: Stage, ctx: Context) -> bool:
    """Finished before (by setup, with the same inputs, its outputs still in place; or by any
    other route, as its outputs show)."""
    if stage.inputs is None or stage.done is None:
        return False
    try:
        stamp = json.loads(_stamp_file(ctx, stage.name).read_text())
        if stamp.get("inputs") == _digest(stage.inputs(ctx)) and stage.done(ctx):
            return True
    except (FileNotFoundError, json.JSONDecodeError, BuunError):
        pass  # no stamp, or an earlier stage is missing
    try:
        return stage.current is not None and stage.current(ctx)
    except BuunError:
        return False


def _mark_done(stage: Stage, ctx: Context) -> None:
    if stage.inputs is None:
        return
    write_json_atomic(_stamp_file(ctx, stage.name), {"inputs": _digest(stage.inputs(ctx)), "finished": time.time()})


def _quiet(check: Callable[[], Any]) -> bool:
    try:
        check()
        return True
    except BuunError:
        return False


# --- the stages -----------------------------------------------------------------------------

def _doctor(ctx: Context) -> None:
    checks = doctor.run_checks(ctx.recipe, ctx.models_dir, cpu_only=ctx.cpu)
    failed = [c for c in checks if c.failed]
    if failed:
        raise BuunError("the machine is not ready:\n  " + "\n  ".join(f"{c.name}: {c.detail}" for c in failed),
                        "; ".join(c.fix for c in failed if c.fix) or "run `buun doctor` for details",
                        exit_code=Exit.NOT_READY)
    gpus = [] if ctx.cpu else build.detect_gpus()
    if gpus:
        _check_gpu_memory(ctx, gpus[0])
    console.ok("doctor: the required checks pass" + ("" if gpus else " (no GPU: CPU build)"))


def _check_gpu_memory(ctx: Context, gpu: build.Gpu) -> None:
    """Before any download: would the recipe's server fit this GPU at all?"""
    flags = fit.flags_from_recipe(ctx.recipe)
    need = fit.predict(ctx.recipe, flags)
    gib = gpu.memory_mib / 1024
    if fit.fits(need, gib, margin_gib=0.25):
        return
    best = fit.max_context(ctx.recipe, flags, gib)
    hint = (f"the largest context that fits is -c {best}: pass `-- -c {best}` or a smaller KV cache type "
            f"(`-- -ctk q8_0 -ctv q8_0`); `buun fit {ctx.recipe.name} --gpu-mem {gib:.0f}` shows the options"
            if best else f"`buun fit {ctx.recipe.name} --gpu-mem {gib:.0f}` shows what would fit")
    raise BuunError(f"{ctx.recipe.name} needs about {need.total / 2**30:.1f} GiB of GPU memory with its settings; "
                    f"{gpu.name} has {gib:.1f} GiB", hint, exit_code=Exit.NOT_READY)


def _build(ctx: Context) -> None:
    build.build(build.plan(cpu=ctx.cpu))


def _patch(ctx: Context) -> None:
    console.ok(patches.describe_applied(patches.apply()))


def _server_args(ctx: Context) -> list[str]:
    """llama-server's arguments beyond the recipe's: a CPU setup offloads no layer, then the
    user's own flags (after `--`), which win."""
    return [*(("-ngl", "0", "-ngld", "0") if ctx.cpu else ()), *ctx.extra]


def _pull_inputs(ctx: Context) -> dict[str, Any]:
    return {role: [s.repo, s.revision, sorted(s.files)] for role, s in ctx.recipe.repos().items()}


def _commits(ctx: Context, roles: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for role in roles:
        manifest = pull.read_manifest(ctx.layout.role_dir(role)) or {}
        out[role] = manifest.get("commit")
    return out


def _pulled(ctx: Context) -> bool:
    return all(_quiet(lambda r=role: pull.require_pulled(ctx.recipe, r, ctx.models_dir)) for role in pull.ROLES)


def _pulled_as_recipe(ctx: Context) -> bool:
    """Every role's folder holds the recipe's repo and revision, each file as it was verified."""
    for role, spec in ctx.recipe.repos().items():
        folder = ctx.layout.role_dir(role)
        manifest = pull.read_manifest(folder)
        if not manifest or (manifest.get("repo"), manifest.get("revision")) != (spec.repo, spec.revision):
            return False
        for name in spec.files:
            entry = manifest["files"].get(name)
            if entry is None or not (folder / name).is_file() or not pull.unchanged(folder / name, entry):
                return False
    return True


def _convert_inputs(ctx: Context) -> dict[str, Any]:
    pin = vendor.load_pin()
    return {"sources": _commits(ctx, ("drafter", "tokenizer")), "quant": ctx.recipe.quantize,
            "pin": pin.tree, "patches": patches.fingerprint()}


def _serve(ctx: Context) -> spec_mod.LaunchSpec:
    spec, key = spec_mod.resolve(str(ctx.recipe.source), models_dir=ctx.models_dir, host=ctx.host, port=ctx.port,
                                 extra=_server_args(ctx), api_key=ctx.api_key, no_api_key=ctx.no_api_key)
    inst = instance.Instance(spec.name)
    current = control.status(inst, key)
    if current.get("state") == "ready" and _same_launch(inst, spec):
        console.ok(f"{spec.name} is already running: {spec.url}")
        return spec
    if current.get("state") not in (None, "stopped", "failed"):
        console.step(f"{spec.name} runs with other settings: restarting it")
        control.stop(inst)
    spec.check_files()
    console.step(f"starting {spec.name} on {spec.url}")
    control.start_detached(spec, key, True, lambda text: console.info(f"    {text}"))
    console.ok(f"{spec.name} is ready: {spec.url}")
    return spec


def _same_launch(inst: instance.Instance, spec: spec_mod.LaunchSpec) -> bool:
    running = inst.read_spec()
    return bool(running) and spec_mod.LaunchSpec.from_json(running).argv == spec.argv


STAGES: tuple[Stage, ...] = (
    Stage("doctor", "check the OS, GPU, toolchain, disk and GPU memory", _doctor),
    Stage("vendor", "fetch the pinned llama.cpp into vendor/llama.cpp", lambda ctx: vendor.vendor(),
          inputs=lambda ctx: {"pin": vendor.load_pin().tree},
          done=lambda ctx: vendor.state().at_pin, current=lambda ctx: vendor.state().at_pin),
    Stage("patch", "apply the patch series", _patch,
          inputs=lambda ctx: {"pin": vendor.load_pin().tree, "patches": patches.fingerprint()},
          done=lambda ctx: all(s.state == "applied" for s in patches.status()),
          current=lambda ctx: vendor.state().at_pin and all(s.state == "applied" for s in patches.status())),
    Stage("build", "build llama.cpp (a no-op when its stamp matches)", _build),
    Stage("pull", "download the target GGUF, the drafter and the tokenizer",
          lambda ctx: pull.pull(ctx.recipe, ctx.models_dir),
          inputs=_pull_inputs, done=_pulled, current=_pulled_as_recipe),
    Stage("drafter", "copy the tokenizer files into the drafter folder",
          lambda ctx: drafter.prepare(ctx.recipe, ctx.models_dir),
          inputs=lambda ctx: _commits(ctx, ("drafter", "tokenizer")),
          done=lambda ctx: _quiet(lambda: drafter.check_folder(ctx.recipe, ctx.models_dir)),
          current=lambda ctx: drafter.is_prepared(ctx.recipe, ctx.models_dir)),
    Stage("convert", "convert the drafter to GGUF, quantize and verify it",
          lambda ctx: convert_stage.convert(ctx.recipe, ctx.models_dir),
          inputs=_convert_inputs,
          done=lambda ctx: _quiet(lambda: convert_stage.require_converted(ctx.recipe, ctx.models_dir)),
          current=lambda ctx: convert_stage.made_from_pulled(ctx.recipe, ctx.models_dir)),
    Stage("serve", "start the supervised llama-server and wait until it is ready", _serve),
)


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
        f"  drafter      {spec.draft}",
        f"  smoke test   {result.tokens} tokens at {result.tok_per_s:.1f} tok/s, {acc}",
        f"  command      {command.display(spec.argv)}",
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

@dataclass
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


def _build_row(ctx: Context, stage: Stage, earlier_run: bool) -> PlanRow:
    p = build.plan(cpu=ctx.cpu)
    what = f"build llama.cpp for the {'GPU (CUDA, sm_' + str(p.arch) + ')' if p.variant == 'cuda' else 'CPU'}"
    try:
        done = not earlier_run and build.up_to_date(p)
    except BuunError:
        done = False
    return PlanRow(stage.name, "skip" if done else "run", what + (": up to date" if done else ""))


def _serve_row(ctx: Context, stage: Stage, argv: list[str]) -> PlanRow:
    inst = instance.Instance(ctx.recipe.name)
    running = inst.read_spec()
    same = (control.status(inst).get("state") == "ready" and bool(running)
            and spec_mod.LaunchSpec.from_json(running).argv == argv)
    return PlanRow(stage.name, "skip" if same else "run",
                   f"{ctx.recipe.name} is already running with this command" if same else stage.what)


def plan(ctx: Context) -> list[PlanRow]:
    """What `run` would do, stage by stage: the same checks, nothing changed."""
    lay = ctx.layout
    binary = "llama-server"
    try:
        binary = str(build.find_binary("llama-server"))
    except NotReadyError:
        pass
    # as spec_mod.resolve builds it (no secret among the flags, the recipe's name as --alias), so
    # that it compares equal to the command of a server that runs
    overrides = command.parse_args(_server_args(ctx))
    flags, secrets = command.take_secrets(command.merge(command.recipe_flags(ctx.recipe.server_flags), overrides))
    flags, _ = spec_mod.with_context(ctx.recipe, flags, overrides, ctx.models_dir)
    argv = command.server_argv(binary, str(lay.target_gguf), str(lay.drafter_gguf()), ctx.host, ctx.port, flags,
                               alias=ctx.recipe.name)
    key = ctx.api_key or secrets.get("--api-key")
    rows: list[PlanRow] = []
    for stage in STAGES:
        if stage.name == "build":  # a vendor or patch that runs first changes the tree it builds
            rows.append(_build_row(ctx, stage, any(r.action == "run" for r in rows)))
        elif stage.name == "serve":
            rows.append(_serve_row(ctx, stage, argv))
            rows[-1].detail = command.display(argv, key)
        elif stage.inputs is None:
            rows.append(PlanRow(stage.name, "check", stage.what + (" (CPU: no CUDA needed)" if ctx.cpu else "")))
        else:
            done = is_done(stage, ctx)
            rows.append(PlanRow(stage.name, "skip" if done else "run", stage.what))
            if stage.name == "pull" and not done:
                rows[-1].detail = _download_detail(ctx)
    return rows


def _confirm(ctx: Context, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("buun setup downloads models and builds llama.cpp; in a non-interactive shell pass --yes")
    import typer

    if not typer.confirm(f"Set up {ctx.recipe.name} (downloads ~{doctor.disk_needed(ctx.recipe) / 2**30:.0f} GiB "
                         "with the build and conversion)?", default=True):
        raise BuunError("cancelled", exit_code=Exit.INTERRUPTED)


def run(ctx: Context, yes: bool = False) -> tuple[spec_mod.LaunchSpec, Smoke]:
    _confirm(ctx, yes)
    spec: spec_mod.LaunchSpec | None = None
    for stage in STAGES:
        if is_done(stage, ctx):
            console.ok(f"{stage.name}: done (inputs unchanged), skipped")
            _mark_done(stage, ctx)  # done by another route: stamped, so the next check is the cheap one
            continue
        console.step(f"{stage.name}: {stage.what}")
        result = stage.run(ctx)
        _mark_done(stage, ctx)
        if stage.name == "serve":
            spec = result
    assert spec is not None
    console.step("smoke test: one completion through the server")
    return spec, smoke(spec.url, ctx.api_key)
