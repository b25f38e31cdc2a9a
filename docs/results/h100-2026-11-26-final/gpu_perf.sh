#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The DFlash performance patches measured on a lent GPU machine: upstream's snapshot rollback
# (LLAMA_RS_ROLLBACK=snapshot) against the series' tape replay, and upstream's sampler chain
# (LLAMA_SAMPLING_GREEDY=0) against 0008's greedy argmax, in one build and one session (each
# variant with every other patch of the series, 0006's matmul tiles included).
# Start it detached and poll (see scripts/gpu_session.sh), results in /tmp/buun-gpu/results:
#   correctness harness on CUDA; llama-bench of the 16-token batch a verify runs and of one AR
#   token; per-phase profiles of a DFlash step (LLAMA_SPEC_PROFILE=1, patch 0004) at synthetic
#   AL 1 and 8.31; `buun bench` tok/s (AR and synthetic AL 1 / 7.67 / 8.31) for upstream's
#   rollback (LLAMA_RS_ROLLBACK=snapshot), the tape replay (0005), the tape with upstream's
#   sampler chain, and the tape with the target's sampling on the GPU (-bs: with 0008 one argmax
#   per verified row); `buun fit --measure` GPU memory; and the stall reasons of the
#   16-column MMQ kernel (ncu --set full on two of its launches).
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
step llama-bench 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1,16 -n 128 -r 5

# name | environment | extra llama-server flags. snapshot: 0005's tape replay off; chain: 0008's
# greedy argmax off (same build)
VARIANTS=("snapshot|LLAMA_RS_ROLLBACK=snapshot|"
          "tape||"
          "tape-chain|LLAMA_SAMPLING_GREEDY=0|"
          "tape-bs||-bs")
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name vars extra <<< "$v"
    gpu_profile "$name" $vars -- --server-args "$extra"
done
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r name vars extra <<< "$v"
    step "bench-$name" 600 env $vars $BUUN bench "${BENCH[@]}" --server-args "$extra" \
        --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-$name"
done
for rb in snapshot tape; do
    step "fit-$rb" 200 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 0 --rollback $rb --measure --scale full --json
done
step fit-ar 200 $BUUN fit --ctx 6048 --draft-max 0 --measure --scale full --json
step fit-3090 60 $BUUN fit --gpu-mem 24
gpu_ncu_mmq mmq

gpu_pack
log "done in $SECONDS s"
