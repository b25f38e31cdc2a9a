#!/usr/bin/env bash
# session 34: what a slots group's first verifies pay (journal section 55). Four and eight slots at
# synthetic AL 7.67 with the recipe's --spec-verify-max 64, two groups on each server (--repeats
# 2), once with CUDA's default lazy module loading and once with CUDA_MODULE_LOADING=EAGER: a cost
# that the second group does not pay, or that eager loading removes, is a once-a-process cost
# (~10 min on 16 cores; summary.txt has each bench's tok/s and AL, profile.txt the step profiles).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
bash scripts/gpu_run.sh build-lean || exit 1
. scripts/gpu_lib.sh
export BUUN_LLAMA_BIN_DIR=$BIN
slots() {  # NAME SLOTS PROMPTS TOKENS LOADING
    step "$1" 600 env LLAMA_SPEC_PROFILE=1 CUDA_MODULE_LOADING="$5" $BUUN bench "${BENCH[@]}" --no-ar \
        --synthetic-al 7.67 --concurrency "$2" --prompts "$3" --n-predict "$4" --repeats 2 --out "$RES/$1"
    python3 - "$RES/$1/bench.json" "$1" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [f"{r['config']}: {r.get('aggregate_tps') or r['decode_tps']:.1f} tok/s AL {r.get('mean_al') or 0:.2f}"
        for r in d["summary"]]
groups = [f"{g['config']}#{g['index']}: {g['decode_tokens'] / g['window_ms'] * 1000:.1f}" for g in d["groups"]]
print(sys.argv[2], "|", "; ".join(rows), "| groups:", ", ".join(groups))
PY
    for f in "$RES/$1"/server-*c*.log; do
        grep "spec profile" "$f" | sed "s|^.*spec profile: |$1/$(basename "$f"): |" >> "$RES/profile.txt"
    done
}
slots s8-lazy 8 8 256 LAZY
slots s8-eager 8 8 256 EAGER
slots s4-lazy 4 4 512 LAZY
slots s4-eager 4 4 512 EAGER
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> "$RES/summary.txt"
