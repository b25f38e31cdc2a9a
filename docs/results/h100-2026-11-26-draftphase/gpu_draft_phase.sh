#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patches 0010 (top-k without sorting) and 0011 (device-resident target features) against their
# switches (GGML_CUDA_TOP_K_SMALL=0, LLAMA_DFLASH_DEVICE_FEATURES=0), one build: test-backend-ops
# TOP_K, the per-phase profile of each combination, the correctness harness on CUDA, ncu kernel
# times of a few DFlash steps, and `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31) with both
# patches and without. Start it detached and poll (see scripts/gpu_session.sh); results in
# /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
gpu_tbo_variants TOP_K 248320 "topk|" "sort|GGML_CUDA_TOP_K_SMALL=0"
gpu_ar_bench

OFF="GGML_CUDA_TOP_K_SMALL=0 LLAMA_DFLASH_DEVICE_FEATURES=0"
gpu_profile new
gpu_profile no-topk GGML_CUDA_TOP_K_SMALL=0
gpu_profile no-devfeat LLAMA_DFLASH_DEVICE_FEATURES=0
gpu_profile off $OFF
gpu_profile new-nographs GGML_CUDA_DISABLE_GRAPHS=1
gpu_ncu_server step-al1 "$RES/profile-new/server-dflash-al1.log"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_benches "tape-new|" "tape-off|$OFF" "snapshot-new|LLAMA_RS_ROLLBACK=snapshot"

gpu_pack
log "done in $SECONDS s"
