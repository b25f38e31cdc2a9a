"""Sum `ncu --csv --metrics gpu__time_duration.sum` output per kernel (name cut at its arguments).

    python3 scripts/ncu_sum.py FILE   -> the window's total, then the 18 costliest kernels
"""

import collections
import csv
import sys

SCALE_TO_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}


def main(path: str) -> None:
    with open(path, errors="replace") as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0][:70]
        us = float(r["Metric Value"].replace(",", "")) * SCALE_TO_US.get(r.get("Metric Unit", "ns"), 1e-3)
        total[name] += us
        count[name] += 1
    all_us = sum(total.values()) or 1.0
    print(f"{path}: {sum(count.values())} kernels, {all_us:.0f} us")
    for name, us in total.most_common(18):
        print(f"{us:9.0f} us {100 * us / all_us:5.1f}% n={count[name]:4d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
