#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0022 (the drafter's second scheduler) on one GPU, in the little device time a session had
# left: the lean build (gpu_prepare_lean), llama-bench (AR), then the per-phase profile (AL 1 and
# 8.31) of the series (all) and of the series with one scheduler in the drafter
# (LLAMA_DFLASH_SCHED_ALT=0), interleaved, twice. ~7 min. Start it detached and poll, packing the
# results into one archive at every poll, since the run may be cut short (docs/benchmarks.md).
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare_lean

gpu_ar_bench
gpu_variants --no-bench "all|" "onesched|LLAMA_DFLASH_SCHED_ALT=0"
log "done in $SECONDS s"
