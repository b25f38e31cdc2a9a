#!/usr/bin/env bash
# Which CUDA graphs a DFlash server runs without capture, and why: the build carries
# scripts/diagnostics/cuda-graph-debug.diff (outside the series), which with GGML_CUDA_GRAPH_DEBUG=1
# logs at warning level every graph whose node properties changed (the first node that did, and
# what in it) and every capture, per backend context (target and drafter). The profile at AL 1
# and 8.31 with it, then without it as the reference. ~8 min. Start it detached and poll (see
# scripts/gpu_session.sh); results in /tmp/buun-gpu/results (graph-debug.txt: events by count).
# As of commit 45681ae this script ran with the diff as patch 0021, whose INFO-level lines the
# server's default verbosity dropped, and benched n_kv paddings of 1024, 4096 and 256.
export GPU_EXTRA_DIFF=scripts/diagnostics/cuda-graph-debug.diff
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_profile debug GGML_CUDA_GRAPH_DEBUG=1
grep -h "cuda graph debug" "$RES"/profile-debug/server-*.log | sed "s/^[0-9.]* [A-Z] //" | sort | uniq -c | sort -rn > "$RES/graph-debug.txt"
gpu_profile reference

gpu_pack
log "done in $SECONDS s"
