#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0009's final kernel in DFlash (MMQ vs the kernel, one build: per-phase profile and
# `buun bench` at synthetic AL 1 / 7.67 / 8.31, tape and snapshots) and the per-kernel GPU times
# of a few DFlash steps (ncu on llama-server, split by stream into verify / inject / draft).
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_ar_bench
gpu_profile small
gpu_ncu_server step-al1 "$RES/profile-small/server-dflash-al1.log"
gpu_profile mmq GGML_CUDA_MMQ_SMALL=0
gpu_profile snapshot-small LLAMA_RS_ROLLBACK=snapshot
gpu_benches "tape-small|" "tape-mmq|GGML_CUDA_MMQ_SMALL=0" "snapshot-small|LLAMA_RS_ROLLBACK=snapshot"

gpu_pack
log "done in $SECONDS s"
