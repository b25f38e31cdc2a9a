#!/usr/bin/env bash
# session 36, issue #49 (journal 2026-11-30, section 57): what llama-server's host copies of a
# prompt's state cost a DFlash server of the 27B: the context checkpoints a hybrid model's prompt
# makes near its end (each a copy of the slot's delta-net state to host memory) and the prompt
# cache's saves of slots' states when a slot takes a new task. Four slots at synthetic AL 7.67
# (`buun bench --concurrency 4`, one slot then four at once) with the server's trace log and its
# timestamps, as llama-server defaults (checkpoints and prompt cache on), with both off
# (--ctx-checkpoints 0 --cache-ram 0) and with the prompt cache alone off, interleaved; logcost.py
# reads each server log's copies. Then the chain at AL 1 / 7.67 / 8.31 beside AR, and patch 0001's
# chain kernel built as Ampere's compute_86 PTX against this card's own build (gdn_bench.cu's
# outputs). ~14 min on 16 cores; summary.txt, profile.txt and logcost.txt come back (the recorded
# summary.txt holds logcost.txt, the first tokens the polls read and state_copy_bench.cu's output).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
. scripts/gpu_lib.sh
HERE=docs/results/h200-2026-11-30-ckpt
gpu_prepare_lean
LOG="-lv 4 --log-timestamps"
for round in 1 2; do
    gpu_slots "s4-def-$round" 4 4 512 -- --server-args "$LOG"
    gpu_slots "s4-nock-$round" 4 4 512 -- --server-args "--ctx-checkpoints 0 --cache-ram 0 $LOG"
    [ "$round" = 2 ] || gpu_slots "s4-noram-$round" 4 4 512 -- --server-args "--cache-ram 0 $LOG"
done
python3 "$HERE/logcost.py" "$RES"/s4-*/server-*.log > "$RES/logcost.txt" 2>&1
gpu_bench_line chain
# 0001's chain kernel as compute_86 PTX (what a 3090 gets, compiled by the driver here) against sm_90
g=vendor/llama.cpp/ggml
for arch in "sm_$CUDA_ARCH" compute_86; do
    step "gdn-$arch-build" 300 nvcc -O3 -std=c++17 -arch="$arch" -I$g/include -I$g/src -I$g/src/ggml-cuda \
        scripts/cuda/gdn_bench.cu -o "$W/gdn-$arch" -Xlinker --unresolved-symbols=ignore-all &&
        step "gdn-$arch" 300 "$W/gdn-$arch" "$W/gdn-$arch.bin" 200 && grep -E "^chain,(16|32)," "$RES/gdn-$arch.log" | tee -a "$RES/summary.txt"
done
python3 - "$W/gdn-sm_$CUDA_ARCH.bin" "$W/gdn-compute_86.bin" >> "$RES/summary.txt" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
same = a.shape == b.shape and bool((a == b).all())
d = np.abs(a - b).max() if a.shape == b.shape else float("nan")
print(f"gdn compute_86 against sm_90: {a.size} outputs, {'equal to the bit' if same else f'max abs difference {d:.3g}'}")
PY
echo ALLDONE >> "$RES/summary.txt"
