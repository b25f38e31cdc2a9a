"""Stage 0: check the machine before anything long runs.

Each check is ok / warn / fail with the fix to apply. Only `required` failures make doctor
(and `buun setup`) stop; a machine without a GPU is told so plainly and the CPU path passes.
"""

from __future__ import annotations

import math
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from buun_tool.base import nvidia, paths
from buun_tool.base.errors import BuunError
from buun_tool.formats import model_plan
from buun_tool.formats.recipes import Recipe
from buun_tool.pipeline import build, patches, vendor

# What a build needs besides the models: the vendored tree and a CUDA build directory.
BUILD_DISK_BYTES = 3 * 2**30


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.status == "fail" and self.required


def _version_of(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown version"


def _tool(name: str, cmd: list[str], fix: str, required: bool = True, min_version: tuple[int, ...] = ()) -> Check:
    version = _version_of(cmd)
    if version is None:
        return Check(name, "fail" if required else "warn", "not found", fix, required)
    if min_version:
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
        found = tuple(int(x) for x in m.groups() if x) if m else ()
        if found and found < min_version:
            want = ".".join(map(str, min_version))
            return Check(name, "fail" if required else "warn", f"{version} (need >= {want})", fix, required)
    return Check(name, "ok", version, required=required)


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", "ok" if ok else "fail", platform.python_version(),
                 "" if ok else "install Python 3.11 or newer")


def check_gpu(cpu_only: bool, gpus: list[nvidia.Gpu] | None = None) -> list[Check]:
    """The GPU lines; `gpus` is detect_gpus's answer when the caller already has it."""
    gpus = nvidia.detect_gpus() if gpus is None else gpus
    if not gpus:
        listed = nvidia.listed_gpus()
        if listed:
            return [Check("gpu", "warn", f"nvidia-smi lists {listed} GPU(s) but does not report their compute "
                          "capability (a driver too old for its compute_cap query): buun will build and run on "
                          "the CPU", "update the NVIDIA driver", required=False)]
        detail = "no NVIDIA GPU visible (nvidia-smi missing or sees none): buun will build and run on the CPU"
        return [Check("gpu", "warn", detail, "install the NVIDIA driver if this machine has a GPU", required=False)]
    # one line per card, by nvidia-smi's index (what `buun serve --gpus` takes)
    checks = [Check("gpu" if len(gpus) == 1 else f"gpu {g.index}", "ok",
                    f"{g.name}, compute {g.compute_cap}, {g.memory_mib / 1024:.1f} GiB") for g in gpus]
    checks.append(Check("driver", "ok", gpus[0].driver))
    archs = sorted({g.arch for g in gpus}, key=lambda a: (len(a), a))
    if len(archs) > 1:
        checks.append(Check("gpu archs", "warn", f"the cards differ in arch ({', '.join(f'sm_{a}' for a in archs)}): "
                            f"`buun build` compiles for all of them (CMAKE_CUDA_ARCHITECTURES={';'.join(archs)})",
                            "rebuild after adding or swapping a card: `buun build`", required=False))
    built = str((build.read_stamp("cuda") or {}).get("arch") or "")
    missing = [g for g in gpus if built and g.arch not in built.split(";")]
    if missing:
        checks.append(Check("build arch", "warn", f"the CUDA build is for sm_{built.replace(';', ', sm_')}: no code "
                            "for " + ", ".join(f"GPU {g.index} (sm_{g.arch})" for g in missing),
                            "run `buun build`: it compiles for every card here", required=False))
    # the small-batch K-quant kernels (patch 0003) use Ampere's integer MMA; older cards get
    # llama.cpp's own kernels for a verify's few columns
    old = [g for g in gpus if g.cc < (8, 0)]
    if old:
        checks.append(Check("gpu kernels", "warn", ", ".join(f"GPU {g.index} (compute {g.compute_cap})" for g in old)
                            + " predates Ampere (compute 8.0): buun's small-batch matmul kernels do not run there, "
                            "llama.cpp's own do, so a DFlash step costs more", required=False))
    nvcc = build.find_nvcc()
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
        release = build.nvcc_release(out)
        # CUDA 13 dropped Maxwell, Pascal and Volta: its nvcc compiles for compute 7.5 and newer
        unbuildable = [g for g in gpus if release is not None and release >= (13, 0) and g.cc < (7, 5)]
        if unbuildable:
            checks.append(Check("nvcc", "warn" if cpu_only else "fail",
                                f"CUDA {release[0]}.{release[1]} compiles for compute 7.5 (Turing) and newer: no code "
                                "for " + ", ".join(f"GPU {g.index} (compute {g.compute_cap})" for g in unbuildable),
                                "install a CUDA 12 toolkit and put its nvcc first on PATH, or build for the CPU "
                                "with --cpu", required=not cpu_only))
        else:
            checks.append(Check("nvcc", "ok", out.splitlines()[-1] if out else nvcc))
    else:
        checks.append(Check("nvcc", "warn" if cpu_only else "fail", "CUDA toolkit not found",
                            "install the CUDA toolkit (nvcc), or build for the CPU with --cpu", required=not cpu_only))
    return checks


def disk_needed(recipe: Recipe | None) -> int:
    """Bytes a full setup writes: the target GGUF, the drafter's BF16 weights twice (the download
    and its GGUF conversion), its quantized GGUF and the build. Sizes come from the exact tensor
    list of the recipe's geometry (the same plan `buun synth` writes)."""
    if recipe is None:
        return BUILD_DISK_BYTES
    pair = model_plan.plan_pair(recipe, "full", "q4_k_m", "q4_k")
    drafter_bf16 = 2 * sum(math.prod(t.ne) for t in pair.drafter.tensors)
    return pair.target.tensor_bytes + 2 * drafter_bf16 + pair.drafter.tensor_bytes + BUILD_DISK_BYTES


def check_disk(recipe: Recipe | None, models_dir: Path) -> Check:
    """Free space where the models go (the folder itself, or the nearest parent that exists)."""
    target = models_dir
    probe = next((p for p in [target, *target.parents] if p.exists()), Path("/"))
    if not probe.is_dir():  # measured as if it were the folder: "ok", and setup failed at its first download
        return Check("disk", "fail", f"{probe} is a file: the models folder {target} cannot be made there",
                     "pass --models-dir (or BUUN_MODELS_DIR) with a folder, or one that does not exist yet")
    free = shutil.disk_usage(probe).free
    need = disk_needed(recipe)
    what = f"{free / 2**30:.1f} GiB free at {probe}, {need / 2**30:.1f} GiB needed"
    if free < need:
        return Check("disk", "fail", what, "free some space or pass --models-dir on a larger disk")
    return Check("disk", "ok", what)


def check_llama_state() -> list[Check]:
    pin = vendor.load_pin()
    st = vendor.state(pin)
    checks = [Check("vendor", "ok" if st.present and st.at_pin else "warn", st.describe(pin),
                    "" if st.present and st.at_pin else "run `buun vendor`", required=False)]
    if st.present and st.at_pin:
        try:
            states = patches.status()
        except BuunError as exc:
            states, detail = [], str(exc)
        else:
            detail = patches_summary(states)
        pending = [s for s in states if s.state != "applied"]
        checks.append(Check("patches", "warn" if pending else "ok", detail,
                            "run `buun patch`" if pending else "", required=False))
    stamps = {v: build.read_stamp(v) for v in build.VARIANTS}
    built = {v: s for v, s in stamps.items() if s}
    if not built:
        checks.append(Check("build", "warn", "llama.cpp is not built", "run `buun build`", required=False))
    for variant, stamp in built.items():
        arch = f", sm_{stamp['arch']}" if stamp.get("arch") else ""
        status = build.variant_status(variant, stamp)
        if status.current:
            checks.append(Check(f"build ({variant})", "ok", f"{paths.build_dir(variant)}{arch}", required=False))
        else:  # the stamp alone says it was built once, not that it is the tree and flags of now
            again = build.rebuild_command(variant)
            checks.append(Check(f"build ({variant})", "warn",
                                f"{paths.build_dir(variant)}{arch} is stale: {status.detail}",
                                f"run `{again}` (`buun serve` runs the old binaries until then)", required=False))
        if stamp.get("ui") == "none":
            checks.append(Check("web UI", "warn", f"the {variant} llama-server was built without its web chat UI",
                                "install Node.js/npm and run `buun build --force`", required=False))
        else:
            checks.append(Check("web UI", "ok", f"embedded ({stamp.get('ui')})", required=False))
    return checks


def patches_summary(states: list[patches.PatchStatus]) -> str:
    """The series in one short line: how many are applied and, by state, the numbers of the others
    (every patch's number and state, 48 of them then, filled a terminal with `0001:applied, ...`)."""
    if not states:
        return "no patches"
    applied = sum(s.state == "applied" for s in states)
    if applied == len(states):
        return f"all {applied} applied"
    others: dict[str, list[str]] = {}
    for s in states:
        if s.state != "applied":
            others.setdefault(s.state, []).append(s.patch.name.split("-")[0])
    return f"{applied} of {len(states)} applied; " + "; ".join(f"{state}: {', '.join(numbers)}"
                                                                 for state, numbers in others.items())


def run_checks(recipe: Recipe | None, models_dir: Path, cpu_only: bool = False,
               gpus: list[nvidia.Gpu] | None = None) -> list[Check]:
    checks = [
        Check("os", "ok" if sys.platform == "linux" else "warn",
              f"{platform.system()} {platform.release()} ({platform.machine()})",
              "" if sys.platform == "linux" else "buun is made for Linux", required=False),
        check_python(),
        *check_gpu(cpu_only, gpus),
        _tool("git", ["git", "--version"], "apt-get install git"),
        _tool("cmake", ["cmake", "--version"], "apt-get install cmake (3.18 or newer)", min_version=(3, 18)),
        _tool("compiler", ["c++", "--version"], "apt-get install build-essential"),
        _tool("ninja", ["ninja", "--version"], "apt-get install ninja-build (faster builds)", required=False),
        _tool("ccache", ["ccache", "--version"], "apt-get install ccache (fast rebuilds)", required=False),
        _tool("npm", ["npm", "--version"], "install Node.js and npm to build the server's web chat UI",
              required=False),
        check_disk(recipe, models_dir),
        *check_llama_state(),
    ]
    return checks


def to_json(checks: list[Check]) -> dict[str, object]:
    return {"ok": not any(c.failed for c in checks), "checks": [asdict(c) for c in checks]}
