#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# One GPU session's work, run on a lent H100/H200 machine (CUDA, no internet) from a copy of the
# checkout. Start it detached and poll, since it outlasts one 10-minute command:
#
#     setsid nohup bash scripts/gpu_session.sh > /tmp/buun-gpu/driver.log 2>&1 &
#     ... later: cat /tmp/buun-gpu/results/summary.txt
#
# Needs in the working tree: .carry/llama-src.tar.xz (`buun vendor --archive .carry/llama-src.tar.xz`)
# and .whl/ (buun's dependencies as Python 3.12 wheels, see docs/benchmarks.md).
# Steps, each with its own time limit and log in $RES (summary.txt has every exit code):
#   vendor + patch, CUDA build with the product flags (sm_90) while the full-size synthetic pair
#   is written, the correctness harness on CUDA, llama-bench, `buun bench` of the upstream
#   configuration and of the recipe's -cd 256, `buun fit --measure`, and `buun setup` end to end
#   on the tiny pair through the local Hub endpoint (the tests' fixture), with CUDA.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"

step llama-bench 200 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 512 -n 128 -r 3
# the upstream configuration of the anchor figures (n_max 15, -b 256 -ub 64, the draft sized to -c) ...
step bench-upstream 600 $BUUN bench --scale full --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 \
    --suite code --mode raw --prompts 2 --n-predict 512 --out "$RES/bench-upstream"
# ... and with the recipe's draft window (-cd 256, patch 0002)
step bench-cd256 600 $BUUN bench --scale full --no-ar --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 \
    --suite code --mode raw --prompts 2 --n-predict 512 --server-args "-cd 256" --out "$RES/bench-cd256"
step fit-ar 200 $BUUN fit --ctx 6048 --draft-max 0 --measure --scale full --json
step fit-dflash 200 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 0 --measure --scale full --json
step fit-dflash-cd256 200 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 256 --measure --scale full --json
step fit-3090 60 $BUUN fit --gpu-mem 24

# buun setup end to end with CUDA: the tests' local Hub and tiny pair; the converter runs on this
# machine's own Python (torch, transformers), since nothing can be installed here
step setup 900 env BUUN_TEST_NGL=99 BUUN_CONVERTER_PYTHON=python3 \
    python3 -m pytest -q -rA "tests/test_setup.py::test_setup_runs_then_skips_everything"
log "done in $SECONDS s"
