#!/usr/bin/env bash
# Patch 0018 (the delta net with 8 lanes a column) on one H100: test-backend-ops GATED_DELTA_NET
# (eval, and perf of Qwen3.5-27B's delta net at 1 and 16 tokens) with the kernel and with
# GGML_CUDA_GDN_LANES8=0; then the per-phase profile of a DFlash step (AL 1 and 8.31) and `buun
# bench` (AR and synthetic AL 1 / 7.67 / 8.31, -bs as buun serves) of the series (all) and of the
# series without 0018 (nolanes8), interleaved. GDN_REPS=2 runs the profiles and benches twice,
# GDN_NCU=1 adds the kernels of a few steps at AL 1 (ncu) and the correctness harness on CUDA.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
gpu_tbo_variants GATED_DELTA_NET 'head_count=16,head_size=128' "gdn|" "gdn-off|GGML_CUDA_GDN_LANES8=0"
step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5
[ "${GDN_NCU:-0}" = 1 ] && step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"

VARIANTS=("all|" "nolanes8|GGML_CUDA_GDN_LANES8=0")
for rep in $(seq "${GDN_REPS:-1}"); do
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_profile "$name-$rep" $vars
    done
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_benches "$name-$rep|$vars"
    done
done
[ "${GDN_NCU:-0}" = 1 ] && gpu_ncu_server step-al1 "$RES/profile-all-1/server-dflash-al1.log"

gpu_pack
log "done in $SECONDS s"
