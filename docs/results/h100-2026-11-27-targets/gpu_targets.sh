#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The performance issue's targets with the whole series on one GPU (an H200, as the issue's own
# figures, or an H100): the product build, the correctness harness on CUDA, llama-bench, then the
# per-phase profile and `buun bench` of the series (all), of the series with sampling once per row
# (LLAMA_SAMPLER_ROWS=0, patch 0023 off) and with one scheduler in the drafter as well
# (LLAMA_DFLASH_SCHED_ALT=0, 0022 off), interleaved, twice. ~19 min. Start it detached and poll,
# packing the results into one archive at every poll (the device returns only a few files), as
# docs/benchmarks.md shows.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ar_bench
gpu_variants "all|" "rows0|LLAMA_SAMPLER_ROWS=0" "rows0-onesched|LLAMA_SAMPLER_ROWS=0 LLAMA_DFLASH_SCHED_ALT=0"

gpu_pack
log "done in $SECONDS s"
