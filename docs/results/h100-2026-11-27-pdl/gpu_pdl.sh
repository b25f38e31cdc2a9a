#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0024 (PDL for the series' kernels) on one GPU, in a session's last ~10 minutes of device
# time: the lean build with llama-speculative-simple for the harness (gpu_prepare_lean), llama-bench
# (AR), the per-phase profile (AL 1 and 8.31) of the series (all) and of the series with its
# kernels launched plainly (GGML_CUDA_PDL_SERIES=0), interleaved, twice; then the correctness
# harness on CUDA and one bench of the series. ~10 min. Start it detached and poll, packing the
# results into one archive at every poll, since the run may be cut short (docs/benchmarks.md).
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare_lean llama-speculative-simple

gpu_ar_bench
gpu_variants --no-bench "all|" "nopdl|GGML_CUDA_PDL_SERIES=0"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_benches "all-1|"
log "done in $SECONDS s"
