"""Split `ncu --csv --metrics gpu__time_duration.sum` output of a DFlash server into runs of
kernels on one CUDA stream (the target's and the drafter's contexts each have their own), so a
window of a few speculative steps reads as verify / inject / draft groups.

    python3 scripts/ncu_steps.py FILE   -> one line per run (stream, kernels, us, top kernels),
                                           the kernels of the first two drafter runs in order, then
                                           the per-kernel sums of the longest whole target run
"""

import sys

from ncu_sum import per_kernel, read_kernels


def main(path: str) -> None:
    ks = read_kernels(path, name_len=60)
    runs: list[list[tuple[str, str, float]]] = []
    for k in ks:
        if runs and runs[-1][0][0] == k[0]:
            runs[-1].append(k)
        else:
            runs.append([k])
    print(f"{path}: {len(ks)} kernels, {sum(k[2] for k in ks):.0f} us, {len(runs)} runs")
    for run in runs:
        top: dict[str, float] = {}
        for _, name, us in run:
            top[name] = top.get(name, 0.0) + us
        best = ", ".join(f"{n} {u:.0f}" for n, u in sorted(top.items(), key=lambda x: -x[1])[:4])
        print(f"stream {run[0][0]:>4} {len(run):5d} kernels {sum(k[2] for k in run):9.1f} us  {best}")
    streams = [run[0][0] for run in runs]
    small = min(set(streams), key=lambda s: sum(len(r) for r in runs if r[0][0] == s))
    shown = 0
    for run in runs[1:-1]:  # whole runs only
        if run[0][0] != small or shown == 2:
            continue
        shown += 1
        print(f"\nstream {small}, run of {len(run)} kernels:")
        for _, name, us in run:
            print(f"{us:8.1f} us  {name}")
    whole = [run for run in runs[1:-1] if run[0][0] != small]
    if whole:
        longest = max(whole, key=len)
        print(f"\nstream {longest[0][0]}, the longest run ({len(longest)} kernels), per kernel:")
        print("\n".join(per_kernel([(name, us) for _, name, us in longest])))


if __name__ == "__main__":
    main(sys.argv[1])
