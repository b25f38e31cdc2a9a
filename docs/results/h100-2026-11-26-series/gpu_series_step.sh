#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The series as of patch 0012 on one H100: 0012's Q5_K in the small-batch kernel against
# GGML_CUDA_MMQ_SMALL=q4_K (test-backend-ops MUL_MAT q5_K, llama-bench pp16 and its ncu window),
# the per-phase profile and `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31) with the whole
# series, without 0012, and without 0010-0012 (GGML_CUDA_MMQ_SMALL=q4_K GGML_CUDA_TOP_K_SMALL=0
# LLAMA_DFLASH_DEVICE_FEATURES=0), snapshots with the whole series, the correctness harness on
# CUDA and ncu kernel times of a few DFlash steps. Start it detached and poll (see
# scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
gpu_tbo q5k "" test -o MUL_MAT -p 'type_a=q5_K,'
gpu_tbo q5k-mmq GGML_CUDA_MMQ_SMALL=q4_K test -o MUL_MAT -p 'type_a=q5_K,'
gpu_tbo q4k "" test -o MUL_MAT -p 'type_a=q4_K,'
gpu_pp16 q4only GGML_CUDA_MMQ_SMALL=q4_K
gpu_pp16 all
gpu_ar_bench

OFF="GGML_CUDA_MMQ_SMALL=q4_K GGML_CUDA_TOP_K_SMALL=0 LLAMA_DFLASH_DEVICE_FEATURES=0"
gpu_profile all
gpu_profile q4only GGML_CUDA_MMQ_SMALL=q4_K
gpu_profile off $OFF
gpu_profile snapshot-all LLAMA_RS_ROLLBACK=snapshot
gpu_benches "tape-all|" "tape-off|$OFF" "snapshot-all|LLAMA_RS_ROLLBACK=snapshot" \
    "tape-q4only|GGML_CUDA_MMQ_SMALL=q4_K"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ncu_server step-al1 "$RES/profile-all/server-dflash-al1.log"

gpu_pack
log "done in $SECONDS s"
