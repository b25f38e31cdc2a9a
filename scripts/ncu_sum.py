"""Sum `ncu --csv --metrics gpu__time_duration.sum` output per kernel (name cut at its arguments).

    python3 scripts/ncu_sum.py FILE   -> the window's total, then the 30 costliest kernels
"""

import collections
import csv
import sys

SCALE_TO_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}


def read_kernels(path: str, name_len: int = 70) -> list[tuple[str, str, float]]:
    """(stream, kernel name cut at its arguments and at name_len, us) of each kernel, in order."""
    with open(path, errors="replace") as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    return [(r.get("Stream", "?"), r["Kernel Name"].split("(")[0][:name_len],
             float(r["Metric Value"].replace(",", "")) * SCALE_TO_US.get(r.get("Metric Unit", "ns"), 1e-3))
            for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]


def per_kernel(kernels: list[tuple[str, float]], top: int = 30) -> list[str]:
    """One line per kernel name, costliest first: total us, share, launches; then the rest."""
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for name, us in kernels:
        total[name] += us
        count[name] += 1
    all_us = sum(total.values()) or 1.0
    lines = [f"{us:9.0f} us {100 * us / all_us:5.1f}% n={count[name]:4d}  {name}"
             for name, us in total.most_common(top)]
    rest = total.most_common()[top:]
    if rest:
        rest_us = sum(us for _, us in rest)
        lines.append(f"{rest_us:9.0f} us {100 * rest_us / all_us:5.1f}% n={sum(count[n] for n, _ in rest):4d}  "
                     f"({len(rest)} other kernels)")
    return lines


def main(path: str) -> None:
    kernels = [(name, us) for _, name, us in read_kernels(path)]
    print(f"{path}: {len(kernels)} kernels, {sum(us for _, us in kernels):.0f} us")
    print("\n".join(per_kernel(kernels)))


if __name__ == "__main__":
    main(sys.argv[1])
