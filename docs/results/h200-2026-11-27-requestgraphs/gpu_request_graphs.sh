#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patches 0020 (a like sampler keeps the scheduler) and 0021 (CUDA graphs keyed by shape) on one
# GPU: a request's first verify should replay the CUDA graph of the previous request's instead of
# running without one and capturing it again. The build carries
# scripts/diagnostics/cuda-graph-debug.diff (outside the series): with GGML_CUDA_GRAPH_DEBUG=1 it
# logs at warning level every graph whose node properties changed (the first node that did, and
# what in it) and every capture, per backend context (target and drafter). The correctness
# harness on CUDA, llama-bench, the profile with the log (graph-debug.txt: events by count), then
# the per-phase profile and `buun bench` of the series (all) and of the series with both patches
# switched off (LLAMA_SAMPLER_RESERVE=1 GGML_CUDA_GRAPH_SHAPE_KEY=0) and of 0020 alone, interleaved,
# twice. ~18 min.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
# As gpu_graph_debug.sh (commit 45681ae) it ran with the log at info level, which the server's
# default verbosity dropped, and benched n_kv paddings of 1024, 4096 and 256.
export GPU_EXTRA_DIFF=scripts/diagnostics/cuda-graph-debug.diff
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ar_bench

gpu_profile debug GGML_CUDA_GRAPH_DEBUG=1
grep -h "cuda graph debug" "$RES"/profile-debug/server-*.log | sed "s/^[0-9.]* [A-Z] //" | sort | uniq -c | sort -rn > "$RES/graph-debug.txt"

# 0020 alone (nokey) tells whether the shape key still earns its place once addresses are stable
VARIANTS=("all|" "nokey|GGML_CUDA_GRAPH_SHAPE_KEY=0" "off|LLAMA_SAMPLER_RESERVE=1 GGML_CUDA_GRAPH_SHAPE_KEY=0")
gpu_variants "${VARIANTS[@]}"

gpu_pack
log "done in $SECONDS s"
