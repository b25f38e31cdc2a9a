"""Does `buun tune`'s pick equal the fastest configuration of a separate `buun bench` sweep of the
same configurations and workload? (scripts/gpu_run.sh, part `tune`; docs/performance.md)

    python3 scripts/tune_vs_sweep.py TUNE_DIR SWEEP_BENCH.json [MORE_BENCH.json ...]

Each configuration's decode tok/s is taken over all of its requests (tokens over decode time), as
the tune takes it, and the sweep's pick follows the tune's rule (measure/tune.py: pick). The bench
names the chain of the recipe's length `dflash-tree0`, a chain with --draft-max N in its own run
`dflash-tree0` too: a run given after the first is read with its --draft-max.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from buun_tool.measure.tune import Measured, pick
from buun_tool.server.tuned import Choice


def configs_of(bench: dict) -> dict[str, Choice]:
    """bench.json's configurations as tune choices."""
    sets = {c["name"]: dict(tuple(f) for f in c["overrides"]["set"]) for c in bench["configs"]}
    n_max = int(next((f[1] for f in bench["options"]["overrides"]["set"] if f[0] == "--draft-max"), 15))
    out = {}
    for name, flags in sets.items():
        budget = int(flags.get("--spec-tree-budget", 0))
        tree = Choice("tree", 15, budget) if budget > 1 else Choice("chain", n_max)
        out[name] = Choice("ar") if name == "ar" else tree
    return out


def decode_tps(bench: dict, name: str) -> float:
    rows = [s for s in bench["samples"] if s["config"] == name]
    return sum(s["decode_tokens"] for s in rows) * 1000 / sum(s["decode_ms"] for s in rows)


def main(tune_dir: Path, benches: list[Path]) -> int:
    tune = json.loads((tune_dir / "tune.json").read_text())
    measured = []
    for path in benches:
        bench = json.loads(path.read_text())
        for name, choice in configs_of(bench).items():
            if choice.name not in {m.choice.name for m in measured}:
                measured.append(Measured(choice, decode_tps(bench, name), None, None, None, None, 0.0))
    best, why = pick(measured, 15)
    tuned = {r["config"]: r["decode_tps"] for r in tune["measured"]}
    for m in sorted(measured, key=lambda m: -(m.decode_tps or 0)):
        print(f"{m.choice.describe():16s} sweep {m.decode_tps:8.1f} tok/s   tune {tuned.get(m.choice.name, 0):8.1f}")
    same = best.choice.name == tune["picked"]
    print(f"sweep picks {best.choice.name} ({why}); tune picked {tune['picked']} in {tune['seconds']} s: "
          + ("the same" if same else "DIFFERENT"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
