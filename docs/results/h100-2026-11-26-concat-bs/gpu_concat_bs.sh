#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0016 on one H100 and two runs of each variant, interleaved, so that the machine's drift
# falls on all of them: test-backend-ops CONCAT (eval and perf of the conv window) with the
# kernel and with GGML_CUDA_CONCAT_SHORT=0; the correctness harness on CUDA; then the per-phase
# profile of a DFlash step and `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31) of the series
# (all), the series with the target's sampling on the GPU (-bs), without 0016 (noconcat) and without
# 0013 (noq6), in the order all, bs, noconcat, noq6, twice. Start it detached and poll (see
# scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
gpu_tbo_variants CONCAT 'ne_a=\[3,10240' "concat|" "concat-off|GGML_CUDA_CONCAT_SHORT=0"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ar_bench

VARIANTS=("all||" "bs||-bs" "noconcat|GGML_CUDA_CONCAT_SHORT=0|" "noq6|GGML_CUDA_MMQ_SMALL=q4_K,q5_K|")
gpu_variants "${VARIANTS[@]}"

gpu_pack
log "done in $SECONDS s"
