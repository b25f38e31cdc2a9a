#!/usr/bin/env bash
# Why a request's first verify runs without its CUDA graph and the next captures it again: the
# profile with GGML_CUDA_GRAPH_DEBUG=1 (a temporary patch logs the first node property that
# changed), then `buun bench` at n_kv granularities of 1024 (0020's default), 4096 and 256
# (upstream's). ~11 min. Start it detached and poll (see scripts/gpu_session.sh); results in
# /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_profile debug GGML_CUDA_GRAPH_DEBUG=1
grep -h "cuda graph debug" "$RES"/profile-debug/server-*.log | sed "s/^[0-9.]* [A-Z] //" | sort | uniq -c | sort -rn > "$RES/graph-debug.txt"
gpu_benches "pad1024|" "pad4096|LLAMA_KV_PAD=4096" "pad256|LLAMA_KV_PAD=256"

gpu_pack
log "done in $SECONDS s"
