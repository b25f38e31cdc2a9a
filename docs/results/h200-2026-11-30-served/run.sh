#!/usr/bin/env bash
# session 36, issue #49 (journal 2026-11-30, section 58): the series with patch 0032 and `buun bench`'s
# served tok/s (from the requests' sending, prefill and first token included, beside the aggregate
# from the group's first token): four slots at synthetic AL 7.67 three times (4 prompts x 512
# tokens, one slot then four at once), eight slots once (8 x 256, the recipe's 64-row verify).
# ~8 min on 16 cores; summary.txt has each bench's aggregate and served tok/s, profile.txt the steps.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
. scripts/gpu_lib.sh
gpu_prepare_lean
for round in 1 2 3; do
    gpu_slots "s4-$round" 4 4 512 --
done
gpu_slots s8 8 8 256 --
python3 - "$RES"/s*/bench.json >> "$RES/summary.txt" <<'PY'
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    for r in d["summary"]:
        if r.get("concurrency", 1) > 1:
            print(f"{f.split('/')[-2]} | at once {r['concurrency']}: aggregate {r['aggregate_tps']:.1f} tok/s "
                  f"({r['vs_one_slot']:.3f}x one slot), served {r['served_tps']:.1f} ({r['served_vs_one_slot']:.3f}x), "
                  f"first token {r['ttft_ms']:.0f} ms")
        else:
            print(f"{f.split('/')[-2]} | one slot: {r['decode_tps']:.1f} tok/s, served {r['served_tps']:.1f}, "
                  f"first token {r['ttft_ms']:.0f} ms")
PY
echo ALLDONE >> "$RES/summary.txt"
