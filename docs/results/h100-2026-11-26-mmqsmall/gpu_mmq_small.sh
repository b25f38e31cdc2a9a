#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0009's register-resident Q4_K matmul for 9-16 columns against MMQ (GGML_CUDA_MMQ_SMALL=0),
# one build: test-backend-ops MUL_MAT for q4_K, llama-bench pp16, ncu per-kernel times of a
# 16-token batch, the per-phase profile, `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31) with the
# tape and with snapshots, the correctness harness on CUDA, and ncu --set full on two launches.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
# name | environment
VARIANTS=("mmq|GGML_CUDA_MMQ_SMALL=0" "small|")
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name vars <<< "$v"
    gpu_tbo "$name" "$vars" test -o MUL_MAT -p 'type_a=q4_K,'
    gpu_pp16 "$name" $vars
done
gpu_ar_bench

gpu_profile mmq GGML_CUDA_MMQ_SMALL=0
gpu_profile snapshot-mmq GGML_CUDA_MMQ_SMALL=0 LLAMA_RS_ROLLBACK=snapshot
gpu_profile snapshot-small LLAMA_RS_ROLLBACK=snapshot
gpu_profile small
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_benches "tape-mmq|GGML_CUDA_MMQ_SMALL=0" "tape-small|" \
    "snapshot-mmq|GGML_CUDA_MMQ_SMALL=0 LLAMA_RS_ROLLBACK=snapshot" "snapshot-small|LLAMA_RS_ROLLBACK=snapshot"
step ncu-small-full 300 "$NCU" --set full --cache-control none --clock-control none -k "regex:^mul_mat_q4_K_small" \
    --launch-skip 200 --launch-count 2 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 16 -n 0 -r 1

gpu_pack
log "done in $SECONDS s"
