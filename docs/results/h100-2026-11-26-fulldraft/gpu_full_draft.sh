#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0018 (a DFlash draft keeps its block length at the end of a request's budget) on one GPU,
# and what a rebuilt verify graph costs: the correctness harness on CUDA, llama-bench tg128, then
# the per-phase profile of a DFlash step (AL 1 and 8.31; its lines end with the steps that
# rebuilt the target's graph and their mean verify time) and `buun bench` (AR and synthetic AL 1 /
# 7.67 / 8.31, -bs as buun serves) of the series (all) and with LLAMA_SPEC_FULL_DRAFT=0
# (shortened), interleaved, twice. ~17 min. Start it detached and poll (see
# scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ar_bench

VARIANTS=("all|" "shortened|LLAMA_SPEC_FULL_DRAFT=0")
gpu_variants "${VARIANTS[@]}"

gpu_pack
log "done in $SECONDS s"
