#!/usr/bin/env bash
# session 23, call 4: 0046 as kept (a tree's kernel at 12 blocks an SM only where more of its blocks
# then fit an SM) against 0045's kernel (GPU_GDN_SRC: 0045's gated_delta_net.cu), gdn-bench twice
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
GPU_GDN_SRC=$PWD/.carry/gdn-old bash scripts/gpu_run.sh gdn-bench
for f in "$RES"/gdn-bench*; do mv "$f" "$RES/kept-$(basename "$f")"; done
