#!/usr/bin/env bash
# Patches 0018 (a DFlash draft keeps its block length at the end of a request's budget) and 0019
# (the small-batch kernel with 32 rows a warp, GGML_CUDA_MMQS_ROWS=32) on one GPU, and what a
# rebuilt verify graph costs. test-backend-ops MUL_MAT of the K-quants (eval, and perf at the
# Qwen3.5-27B verify's shapes) with 16 and 32 rows a warp; the correctness harness on CUDA;
# llama-bench tg128; then the per-phase profile of a DFlash step (AL 1 and 8.31; its lines end
# with the steps that rebuilt the target's graph and their mean verify time) and `buun bench` (AR
# and synthetic AL 1 / 7.67 / 8.31, -bs as buun serves) of the series (all), with
# LLAMA_SPEC_FULL_DRAFT=0 (shortened) and with GGML_CUDA_MMQS_ROWS=32 (rows32), interleaved,
# twice. ~19 min. Start it detached and poll (see scripts/gpu_session.sh); results in
# /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
SHAPES='type_a=q[456]_K,type_b=f32,m=(5120|6144|10240|17408|248320),n=16,'
for v in "rows16|" "rows32|GGML_CUDA_MMQS_ROWS=32"; do
    IFS='|' read -r name vars <<< "$v"
    gpu_tbo "$name" "$vars" test -o MUL_MAT -p 'type_a=q[456]_K,'
    gpu_tbo "perf-$name" "$vars" perf -o MUL_MAT -p "$SHAPES"
done
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5

VARIANTS=("all|" "shortened|LLAMA_SPEC_FULL_DRAFT=0" "rows32|GGML_CUDA_MMQS_ROWS=32")
for rep in 1 2; do
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_profile "$name-$rep" $vars
        gpu_benches "$name-$rep|$vars"
    done
done

gpu_pack
log "done in $SECONDS s"
