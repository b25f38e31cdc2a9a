#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0005 with the replay in every verify-sized graph (one graph shape, reused after a full
# acceptance too), on a lent GPU machine: the correctness harness on CUDA, then `buun bench` with
# LLAMA_SPEC_PROFILE=1 at synthetic AL 7.67 and 8.31 for the tape and for upstream's snapshots
# (LLAMA_RS_ROLLBACK=snapshot), in one build. The server logs give the graphs reused.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
for v in "tape|" "snapshot|LLAMA_RS_ROLLBACK=snapshot"; do
    IFS='|' read -r name vars <<< "$v"
    step "bench-$name" 600 env LLAMA_SPEC_PROFILE=1 $vars $BUUN bench "${BENCH[@]}" --no-ar \
        --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-$name"
    grep -H "spec profile\|graphs reused" "$RES/bench-$name"/server-*.log > "$RES/profile-$name.txt"
done

gpu_pack
log "done in $SECONDS s"
