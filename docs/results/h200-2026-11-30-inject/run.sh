#!/usr/bin/env bash
# session 39, issue #49 (journal 2026-11-30, sections 60 and 61), on the series as it is now. Leases:
# 1 ran the long suite and the four-slot A/B of 0022's one-decode injection (through a switch of
# that run alone); 2 ran the diagnostic bench and the warm-ups of 64 and 16 tokens (interleaved,
# three times each) on the series with 0022's change; 3 ran four slots three times, eight slots
# once and the MUL_MAT check on the series with 0003 taking several sequences' tokens as one matrix.
# Four slots at synthetic AL 7.67 are `buun bench --concurrency 4` (one slot, then four at once);
# the diagnostic bench has the server's debug log and the CUDA graph diagnostic
# (scripts/diagnostics/cuda-graph-debug.diff, inert without GGML_CUDA_GRAPH_DEBUG); the long suite
# decodes 256 and 1024 tokens after prompts of 8192 and 30720 tokens. ~13 min on 16 cores.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
export GPU_EXTRA_DIFF=scripts/diagnostics/cuda-graph-debug.diff
. scripts/gpu_lib.sh
gpu_prepare_lean
gpu_slots s4-diag 4 4 512 GGML_CUDA_GRAPH_DEBUG=1 -- --server-args "-lv 4 --log-timestamps"
grep -E "cuda graph debug|reallocat|reserv|spec profile|new prompt|release:" "$RES/s4-diag/server-dflash-al7.67-c4.log" \
    | cut -c1-260 > "$RES/s4-diag-events.txt"
for round in 1 2 3; do
    gpu_slots "s4-w64-$round" 4 4 512 --
    sed -i 's/^WARM_GROUP_TOKENS = 64$/WARM_GROUP_TOKENS = 16/' buun_tool/measure/bench_run.py
    gpu_slots "s4-w16-$round" 4 4 512 --
    sed -i 's/^WARM_GROUP_TOKENS = 16$/WARM_GROUP_TOKENS = 64/' buun_tool/measure/bench_run.py
done
gpu_slots s8 8 8 256 --
gpu_tbo_build
gpu_tbo stacked "" test -o MUL_MAT -p "type_a=q[46]_K,type_b=f32,m=(5120|100),n=(16|8|3),k=(6144|1280),bs=\[1,1\],nr=\[(4,1|8,1|2,2|5,1)\]"
for n in 256 1024; do
    step "long-$n" 900 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]:0:2}" --suite long --mode raw \
        --synthetic-al 7.67 --n-predict $n --out "$RES/long-$n"
    python3 - "$RES/long-$n/bench.json" "$n" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["samples"]:
    print(f"long-{sys.argv[2]} |", s["config"], s["prompt_tokens"], "tokens: first token", round(s["ttft_ms"]),
          "ms, prefill", round(s["prompt_tokens"] / s["prompt_ms"] * 1000, 1), "tok/s, decode",
          round(s["decode_tokens"] / s["decode_ms"] * 1000, 1), "tok/s")
PY
    for f in "$RES/long-$n"/server-*.log; do
        grep "spec profile" "$f" | sed "s|^.*spec profile: |long-$n/$(basename "$f"): |" >> "$RES/profile.txt"
    done
done
echo ALLDONE >> "$RES/summary.txt"
