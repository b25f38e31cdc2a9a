#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Experiment: patch 0006's 16-column Q4_K MMQ tile (4 warps x 64 rows) at 4, 6 and 8 blocks per SM.
# The occupancy caps the registers a thread may use (128, 80, 64 on sm_90); ncu found the kernel at
# 23% achieved occupancy, stalled on shared-memory loads. Each variant edits the config table in the
# vendor tree, rebuilds (only the MMQ objects recompile) and measures: test-backend-ops MUL_MAT for
# q4_K, llama-bench pp16, the per-phase profile, ncu per-kernel times of a 16-token batch and
# ncu --set full on two launches (Q4_K and Q6_K). The table is restored at the end.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

CFG=vendor/llama.cpp/ggml/src/ggml-cuda/mmq-config-ampere.cuh
cp "$CFG" "$W/cfg.orig"
gpu_tbo_build
for occ in 4 6 8; do
    sed -i "s/CASE(GGML_TYPE_Q4_K, 128, [0-9],  64,  16/CASE(GGML_TYPE_Q4_K, 128, $occ,  64,  16/" "$CFG"
    grep -c "CASE(GGML_TYPE_Q4_K, 128, $occ,  64,  16" "$CFG" | tee -a "$RES/summary.txt"
    step "rebuild-occ$occ" 900 cmake --build vendor/build/cuda -j 16 --target llama-server llama-bench test-backend-ops
    step "tbo-occ$occ" 300 "$BIN/test-backend-ops" test -o MUL_MAT -b CUDA0 -p 'type_a=q4_K,'
    tail -2 "$RES/tbo-occ$occ.log" | tee -a "$RES/summary.txt"
    step "llama-bench-occ$occ" 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 16 -n 0 -r 20
    gpu_profile "occ$occ"
    gpu_ncu_window "pp16-occ$occ" -p 16 -n 0 -r 2
    rm -f "$RES/ncu-pp16-occ$occ.log"
    gpu_ncu_mmq "mmq-occ$occ"
done
cp "$W/cfg.orig" "$CFG"

gpu_pack
log "done in $SECONDS s"
