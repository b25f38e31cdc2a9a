#!/usr/bin/env bash
# session 22, lease 2: the series to 0045 beside unpatched upstream, one run (`buun bench --against upstream`)
set -u
cd "$(dirname "$0")/.."
GPU_UPSTREAM=1 bash scripts/gpu_run.sh build-lean upstream pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
