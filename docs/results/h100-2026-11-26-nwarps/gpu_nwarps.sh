#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The small-batch kernel's launch rule against each block size forced (GGML_CUDA_MMQS_NWARPS=4, 8,
# 16; patch 0017), one build of the series on one H100: test-backend-ops perf of the Qwen3.5-27B
# verify's K-quant matrices at 16 columns, then the per-phase profile of a DFlash step and
# `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31, with -bs as buun serves) for each. Start it
# detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
SHAPES='type_a=q[456]_K,type_b=f32,m=(5120|6144|10240|17408|248320),n=16,'
VARIANTS=("rule|" "nw4|GGML_CUDA_MMQS_NWARPS=4" "nw8|GGML_CUDA_MMQS_NWARPS=8" "nw16|GGML_CUDA_MMQS_NWARPS=16")
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name vars <<< "$v"
    gpu_tbo "perf-$name" "$vars" perf -o MUL_MAT -p "$SHAPES"
done
gpu_ar_bench
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name vars <<< "$v"
    gpu_profile "$name" $vars
done
gpu_benches "${VARIANTS[@]}"

gpu_pack
log "done in $SECONDS s"
