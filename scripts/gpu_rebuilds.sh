#!/usr/bin/env bash
# What a rebuilt verify graph costs and two ways to rebuild less, on one GPU: CUDA graphs keyed by
# the graph's shape (GGML_CUDA_GRAPH_SHAPE_KEY, on by default; =0 keys by the first node's address
# as upstream) and n_kv padded to 1024 cells instead of 256 (LLAMA_KV_PAD). The correctness
# harness on CUDA (with both), then the per-phase profile (its lines end with the verify time of
# rebuilt steps, of the steps after them and of the rest) and `buun bench` of the four
# combinations, interleaved, twice. ~22 min. Start it detached and poll (see
# scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 env LLAMA_KV_PAD=1024 bash scripts/gpu_correctness.sh "$BIN" "$RES"
step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5

VARIANTS=("upstream|GGML_CUDA_GRAPH_SHAPE_KEY=0" "key|GGML_CUDA_GRAPH_SHAPE_KEY=1"
          "pad|GGML_CUDA_GRAPH_SHAPE_KEY=0 LLAMA_KV_PAD=1024" "both|GGML_CUDA_GRAPH_SHAPE_KEY=1 LLAMA_KV_PAD=1024")
for rep in 1 2; do
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_profile "$name-$rep" $vars
        gpu_benches "$name-$rep|$vars"
    done
done

gpu_pack
log "done in $SECONDS s"
