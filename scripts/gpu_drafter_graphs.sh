#!/usr/bin/env bash
# Patch 0022 (the drafter's second scheduler) on one GPU, in the little device time a session had
# left: the lean build (gpu_prepare_lean), llama-bench (AR), then the per-phase profile (AL 1 and
# 8.31) of the series (all) and of the series with one scheduler in the drafter
# (LLAMA_DFLASH_SCHED_ALT=0), interleaved, twice. ~7 min. Start it detached and poll, packing the
# results into one archive at every poll, since the run may be cut short (docs/benchmarks.md).
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare_lean

step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5
for rep in 1 2; do
    gpu_profile "all-$rep"
    gpu_profile "onesched-$rep" LLAMA_DFLASH_SCHED_ALT=0
done
log "done in $SECONDS s"
