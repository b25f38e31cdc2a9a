#!/usr/bin/env bash
# session 37, issue #49 (journal 2026-11-30, section 59): patch 0033, a drafter that keeps missing
# rests (the recipe's --spec-skip-after 3). `buun bench` (AR, synthetic AL 1, 7.67, 8.31; 2 code
# prompts x 512 tokens) with the rule and without it (--spec-skip-after 0), interleaved, twice.
# ~9 min on 16 cores; summary.txt has each bench's tok/s, the AR-step times a token takes at AL 1
# and each DFlash row's ratio to its AR, profile.txt the step profiles. The summary.txt kept here
# also holds the AL 1 servers' profile lines and the first form's run (a rest every other step).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
. scripts/gpu_lib.sh
gpu_prepare_lean
for round in 1 2; do
    gpu_benches "rule-$round|LLAMA_SPEC_PROFILE=1|" "every-$round|LLAMA_SPEC_PROFILE=1|--spec-skip-after 0"
    gpu_profile_lines "rule-$round"
    gpu_profile_lines "every-$round"
done
python3 - "$RES"/bench-*/bench.json >> "$RES/summary.txt" <<'PY'
import json, sys
for f in sys.argv[1:]:
    rows = {r["config"]: r for r in json.load(open(f))["summary"]}
    ar = rows["ar"]["decode_tps"]
    cells = [f"ar {ar:.1f}"]
    for name, r in rows.items():
        if name != "ar":
            cells.append(f"{name} {r['decode_tps']:.1f} ({r['decode_tps'] / ar:.3f}x, AL {r.get('mean_al') or 0:.2f})")
    al1 = next((r for n, r in rows.items() if n.endswith("al1")), None)
    if al1:
        cells.append(f"AR-step times a token at AL 1: {ar / al1['decode_tps']:.3f}")
    print(f.split("/")[-2], "|", "; ".join(cells))
PY
echo ALLDONE >> "$RES/summary.txt"
