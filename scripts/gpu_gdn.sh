#!/usr/bin/env bash
# Patch 0018 (the delta-net kernel with each chunk of tokens staged in shared memory) and 0005's
# replay masks read from a zero row, on one H100: test-backend-ops GATED_DELTA_NET (eval, and perf
# of Qwen3.5-27B's delta net at 1 and 16 tokens) with the kernel and with GGML_CUDA_GDN_STAGED=0;
# the correctness harness on CUDA; then the per-phase profile of a DFlash step and `buun bench`
# (AR and synthetic AL 1 / 7.67 / 8.31, -bs as buun serves) of the series (all) and of the series
# without 0018 (nogdn), interleaved, twice; last the kernels of a few steps at AL 1 (ncu). Start
# it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
gpu_tbo_variants GATED_DELTA_NET 'head_count=16,head_size=128' "gdn|" "gdn-off|GGML_CUDA_GDN_STAGED=0"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5

for rep in 1 2; do
    for v in "all|" "nogdn|GGML_CUDA_GDN_STAGED=0"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_profile "$name-$rep" $vars
        gpu_benches "$name-$rep|$vars"
    done
done
gpu_ncu_server step-al1 "$RES/profile-all-1/server-dflash-al1.log"

gpu_pack
log "done in $SECONDS s"
