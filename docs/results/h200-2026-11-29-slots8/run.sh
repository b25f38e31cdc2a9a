#!/usr/bin/env bash
# session 30: one and several requests at once at synthetic AL 7.67 on the series of 2026-11-29
# (patch 0008 leaving a prompt's rows before the draft's window out): four and eight slots fed as
# many requests at once, against one, and AR's alike (issue #49: eight slots measured).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
export GPU_CONCURRENCY=4,8 GPU_SLOTS_PROMPTS=8 GPU_SLOTS_N=256
bash scripts/gpu_run.sh ${*:-build-lean slots-bench} pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
