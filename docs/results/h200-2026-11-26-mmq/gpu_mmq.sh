#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The small-batch MMQ patch (0006) against the same tree without it, on one lent GPU machine.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results:
#   test-backend-ops MUL_MAT (CUDA against the CPU) for the quant types 0006 retunes; the
#   correctness harness on CUDA; then, with 0006 and again after rebuilding without it (only the
#   MMQ objects recompile): llama-bench of the 16-token batch a verify runs and of AR tokens, the
#   per-phase profile of a DFlash step (LLAMA_SPEC_PROFILE=1) at synthetic AL 1 and 8.31, and
#   `buun bench` tok/s (AR and synthetic AL 1 / 7.67 / 8.31), and per-kernel GPU times (ncu, warm
#   caches, unlocked clocks) over a window of 1400 kernels of a 16-token batch and of AR tokens.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

MMQ_FILES=(ggml/src/ggml-cuda/mmq.cuh ggml/src/ggml-cuda/mmq-config-ampere.cuh)
CHANGED_TYPES='type_a=(q4_0|q4_1|q5_0|q5_1|q8_0|q2_K|q3_K|q4_K|q5_K|q6_K),'

measure() {  # measure TAG: the same measurements for each build
    local tag=$1
    step "llama-bench-$tag" 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 16 -n 128 -r 5
    gpu_profile "$tag"
    step "bench-$tag" 600 $BUUN bench "${BENCH[@]}" \
        --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 1 --n-predict 512 --out "$RES/bench-$tag"
    gpu_ncu_window "pp16-$tag" -p 16 -n 0 -r 2
    gpu_ncu_window "tg-$tag" -p 0 -n 6 -r 1
}

gpu_tbo_build
step tbo-mul-mat 600 "$BIN/test-backend-ops" test -o MUL_MAT -b CUDA0 -p "$CHANGED_TYPES"
tail -3 "$RES/tbo-mul-mat.log" | tee -a "$RES/summary.txt"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
measure mmq16

# the baseline: the same build without 0006 (its two files as the commit before it left them)
P0006=$(git -C vendor/llama.cpp log --format=%H -1 --grep '^cuda: MMQ for 9-16 columns')
git -C vendor/llama.cpp checkout "$P0006~1" -- "${MMQ_FILES[@]}"
step rebuild-base 900 cmake --build vendor/build/cuda -j 16 --target llama-server llama-bench test-backend-ops
measure base
git -C vendor/llama.cpp checkout HEAD -- "${MMQ_FILES[@]}"

gpu_pack
log "done in $SECONDS s"
