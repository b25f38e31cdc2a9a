#!/usr/bin/env bash
# session 36, issue #49 (journal 2026-11-30, section 57): the series with patch 0032 (prompt states
# shared between a slot and the prompt cache, their memory reused, in huge pages). Four slots at
# synthetic AL 7.67 (`buun bench --concurrency 4`, one slot then four at once) three times with the
# server's trace log and timestamps (logcost.py of h200-2026-11-30-ckpt: each checkpoint's and cache
# update's time), once with --no-cache-idle-slots, then the long suite (prompts of 8192 and 30720
# tokens, AR and DFlash): each request's first token, prefill and decode. ~11 min on 16 cores
# (the recorded summary.txt ends with logcost.txt).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
. scripts/gpu_lib.sh
gpu_prepare_lean
LOG="-lv 4 --log-timestamps"
for round in 1 2 3; do
    gpu_slots "s4-$round" 4 4 512 -- --server-args "$LOG"
done
gpu_slots s4-noidle 4 4 512 -- --server-args "--no-cache-idle-slots $LOG"
python3 docs/results/h200-2026-11-30-ckpt/logcost.py "$RES"/s4-*/server-*.log > "$RES/logcost.txt" 2>&1
python3 - "$RES"/s4-*/bench.json >> "$RES/summary.txt" <<'PY'
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    t = {}
    for s in d["samples"]:
        t.setdefault(s["config"], []).append(round(s.get("ttft_ms") or 0))
    print("first token ms |", f.split("/")[-2], t)
PY
step long 900 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]:0:2}" --suite long --mode raw --synthetic-al 7.67 \
    --n-predict 256 --server-args "$LOG" --out "$RES/long"
python3 docs/results/h200-2026-11-30-ckpt/logcost.py "$RES"/long/server-*.log >> "$RES/logcost.txt" 2>&1
python3 - "$RES/long/bench.json" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["samples"]:
    print("long |", s["config"], s["prompt_tokens"], "tokens: first token", round(s["ttft_ms"]), "ms, prefill",
          round(s["prompt_tokens"] / s["prompt_ms"] * 1000, 1), "tok/s, decode",
          round(s["decode_tokens"] / s["decode_ms"] * 1000, 1), "tok/s")
PY
echo ALLDONE >> "$RES/summary.txt"
