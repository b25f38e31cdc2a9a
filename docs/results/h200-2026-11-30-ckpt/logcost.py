"""What a llama-server log at `-lv 4 --log-timestamps` says the prompt's host copies cost: each
context checkpoint's time (from the log line before it to its own: the slot's state copied to the
host), each prompt cache update's (its own line), and the prompts' eval times.

    python3 logcost.py SERVER_LOG...
"""
import re
import sys

TS = re.compile(r"^(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) ")


def ms(line: str) -> float | None:
    m = TS.match(line)
    if not m:
        return None
    mi, s, milli, micro = (int(x) for x in m.groups())
    return (mi * 60 + s) * 1000 + milli + micro / 1000


def main(paths: list[str]) -> None:
    for path in paths:
        prev = None
        ckpt: list[float] = []
        cache: list[float] = []
        saves = 0
        for line in open(path, errors="replace"):
            t = ms(line)
            if t is None:
                continue
            if "created context checkpoint" in line and prev is not None:
                ckpt.append(t - prev)
            m = re.search(r"prompt cache update took ([0-9.]+) ms", line)
            if m:
                cache.append(float(m.group(1)))
            if "saving prompt with length" in line:
                saves += 1
            prev = t
        def stat(xs: list[float]) -> str:
            if not xs:
                return "none"
            return f"{len(xs)}, {sum(xs):.1f} ms in all, median {sorted(xs)[len(xs) // 2]:.1f}, max {max(xs):.1f}"
        print(f"{path}: checkpoints {stat(ckpt)}; cache updates {stat(cache)}; states saved {saves}")


if __name__ == "__main__":
    main(sys.argv[1:])
