"""`buun doctor`, `buun vendor`, `buun patch`, `buun build`: from nothing to llama.cpp binaries.

    buun doctor [--json] [--cpu] [--models-dir DIR]
                                         check the machine (non-zero exit when a required check fails)
    buun vendor [--from-archive FILE]    fetch the pinned llama.cpp into vendor/llama.cpp
    buun vendor --archive FILE           write a trimmed source archive for offline machines
    buun patch [--check|--status|--reverse|--lint]
                                         apply / dry-run / show / remove / lint the patch series
    buun patch export                    regenerate patches/ (and their README's table) from vendor/llama.cpp
    buun build [--cpu|--cuda] [--cuda-arch 86] [--force] [--upstream]
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text

from buun_tool.app import tune as tune_app
from buun_tool.base import console, paths
from buun_tool.base.console import Table
from buun_tool.base.errors import BuunError, Exit, UsageError
from buun_tool.cli.options import ModelsDirOpt
from buun_tool.formats import recipes
from buun_tool.pipeline import build as build_stage
from buun_tool.pipeline import doctor as doctor_stage
from buun_tool.pipeline import patch_lint, patches
from buun_tool.pipeline import vendor as vendor_stage

_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "applied": "green", "pending": "yellow",
                 "stale": "yellow", "conflict": "red"}


def doctor(
    recipe: str = typer.Argument(None, help="Recipe whose disk needs are checked (default: qwen3.5-27b-dflash)."),
    json_out: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    cpu: bool = typer.Option(False, "--cpu", help="Plan a CPU build: a missing CUDA toolkit is not a failure."),
    models_dir: ModelsDirOpt = None,
) -> None:
    """Check the OS, GPU, toolchain, disk (where the models go) and the vendor/patch/build state."""
    r, folder = recipes.load(recipe), paths.models_dir(models_dir)
    checks = [*doctor_stage.run_checks(r, folder, cpu_only=cpu), tune_app.doctor_check(r, folder)]
    if json_out:
        console.print_json(doctor_stage.to_json(checks))
    else:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col)
        for c in checks:
            style = _STATUS_STYLE[c.status]
            table.add_row(c.name, f"[{style}]{c.status}[/]", Text(c.detail), Text(c.fix))  # literal: paths, versions
        console.out.print(table)
    failed = [c.name for c in checks if c.failed]
    if failed:
        if not json_out:
            console.err.print(f"[red]required checks failed:[/] {', '.join(failed)}")
        raise typer.Exit(int(Exit.FAILED))


def vendor(
    from_archive: Path = typer.Option(None, "--from-archive", help="Take the tree from an archive made by --archive."),
    source: str = typer.Option(None, "--source", help="Only this source: git, sdist or archive."),
    archive: Path = typer.Option(None, "--archive", help="Write a trimmed source archive (.tar.xz) and exit."),
    force: bool = typer.Option(False, "--force", help="Fetch again even if the tree is at the pin."),
) -> None:
    """Fetch the pinned llama.cpp into vendor/llama.cpp (a no-op when it is already there)."""
    if archive:
        if from_archive or force:
            raise UsageError("--archive writes an archive of the existing tree; it takes no other option")
        dest = vendor_stage.write_archive(archive)
        console.ok(f"wrote {dest} ({dest.stat().st_size / 2**20:.1f} MiB)")
        return
    vendor_stage.vendor(source=source, archive=from_archive, force=force)


patch_app = typer.Typer(help="Apply buun's patch series to vendor/llama.cpp.", invoke_without_command=True,
                        no_args_is_help=False)


@patch_app.callback()
def patch(
    ctx: typer.Context,
    check: bool = typer.Option(False, "--check", help="Dry run: would the series apply? Changes nothing."),
    status: bool = typer.Option(False, "--status", help="Show which patches are applied."),
    reverse: bool = typer.Option(False, "--reverse", help="Remove the series (back to the pristine pin)."),
    lint: bool = typer.Option(False, "--lint", help="Check that no patch rewrites lines an earlier patch added."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Name each patch applied (or that would apply)."),
) -> None:
    """Apply the patches in order (idempotent; all or nothing)."""
    if ctx.invoked_subcommand:
        return
    if sum((check, status, reverse, lint)) > 1:
        raise UsageError("--check, --status, --reverse and --lint exclude each other")
    if lint:
        found = patch_lint.lint()
        if found:
            raise BuunError(f"{len(found)} line(s) of the series are rewritten by a later patch:\n  "
                            + "\n  ".join(map(str, found[:20])),
                            "fold each fix into the patch that added the line (patches/README.md, "
                            "\"Working on a patch\")", exit_code=Exit.CONFLICT)
        console.ok(f"no patch of the {len(patches.series())} rewrites a line an earlier one added")
    elif status:
        table = Table(box=None)
        table.add_column("patch")
        table.add_column("state")
        table.add_column("")
        for st in patches.status():
            table.add_row(st.patch.name, f"[{_STATUS_STYLE[st.state]}]{st.state}[/]", st.detail)
        console.out.print(table)
    elif check:
        names = patches.check()
        if names:
            console.ok(f"{len(names)} patch(es) would apply cleanly" + patches.names_of(names, verbose))
        else:
            console.ok(f"nothing to apply: all {len(patches.series())} patch(es) are applied")
    elif reverse:
        n = patches.reverse()
        console.ok(f"removed {n} patch commit(s); vendor/llama.cpp is the pristine pin")
    else:
        console.ok(patches.describe_applied(patches.apply(), verbose))


@patch_app.command("export")
def patch_export(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Name each patch written."),
) -> None:
    """Regenerate patches/ from the commits above the baseline in vendor/llama.cpp."""
    names = patches.export()
    console.ok(f"wrote {len(names)} patch(es) to patches/" + (f": {', '.join(names)}" if verbose else ""))


def build(
    cpu: bool = typer.Option(False, "--cpu", help="Build for the CPU even when a GPU is present."),
    cuda: bool = typer.Option(False, "--cuda", help="Build with CUDA (needs nvcc)."),
    cuda_arch: str = typer.Option(None, "--cuda-arch", help="CUDA compute capability, e.g. 86 (default: detected)."),
    jobs: int = typer.Option(None, "--jobs", "-j", min=1, help="Parallel jobs (default: from cores and memory)."),
    ui: str = typer.Option(None, "--ui", help="Web UI: build (npm), prebuilt (download) or none (default: detect)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if nothing changed."),
    upstream: bool = typer.Option(False, "--upstream", help="Build the unpatched pin instead, beside buun's build "
                                  "(its flags unless given, its own stamp), for `buun bench --against upstream`."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Build llama-server, llama-quantize, llama-cli, llama-bench, llama-speculative-simple and the tree checks.

    With --upstream: llama-server and llama-bench of the pinned llama.cpp without buun's patches,
    from the vendored repo's tag buun-baseline, into the build folder's upstream-VARIANT."""
    if upstream and not (cpu or cuda or cuda_arch or ui):
        p = build_stage.upstream_plan(jobs)  # the settings of buun's own build: only the patches differ
    else:
        p = build_stage.plan(cpu=cpu, cuda=cuda, arch=cuda_arch, jobs=jobs, ui=ui)
        p = p.for_upstream() if upstream else p
    if p.ui == "none":
        console.warn("no npm and no network: the server is built without its web chat UI")
    result = build_stage.build(p, force=force)
    if json_out:
        console.print_json(result.to_json())


def register(app: typer.Typer) -> None:
    from buun_tool.cli.options import PIPELINE

    app.command(rich_help_panel=PIPELINE)(doctor)
    app.command(rich_help_panel=PIPELINE)(vendor)
    app.add_typer(patch_app, name="patch", rich_help_panel=PIPELINE)
    app.command(rich_help_panel=PIPELINE)(build)
