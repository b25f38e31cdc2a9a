#!/usr/bin/env bash
# Patch 0013 (the delta-net kernel passes identity tokens by the state update) against
# GGML_CUDA_GDN_SKIP_IDENTITY=0, one build: test-backend-ops GATED_DELTA_NET, the per-phase profile,
# the correctness harness on CUDA, `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31) with the
# whole series and without 0013. Start it detached and poll (see scripts/gpu_session.sh); results
# in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
for v in "skip|" "noskip|GGML_CUDA_GDN_SKIP_IDENTITY=0"; do
    IFS='|' read -r name vars <<< "$v"
    step "tbo-$name" 300 env $vars "$BIN/test-backend-ops" test -o GATED_DELTA_NET -b CUDA0
    tail -2 "$RES/tbo-$name.log" | tee -a "$RES/summary.txt"
done
gpu_profile all
gpu_profile noskip GGML_CUDA_GDN_SKIP_IDENTITY=0
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
tail -1 "$RES/correctness.log" | tee -a "$RES/summary.txt"
# name | environment
BENCHES=("tape-all|" "tape-noskip|GGML_CUDA_GDN_SKIP_IDENTITY=0")
for v in "${BENCHES[@]}"; do
    IFS='|' read -r name vars <<< "$v"
    step "bench-$name" 600 env $vars $BUUN bench "${BENCH[@]}" \
        --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-$name"
done

gpu_pack
log "done in $SECONDS s"
