#!/usr/bin/env bash
# session 25: the series to 0048 (the product today) beside unpatched upstream in one run
# (`buun bench --against upstream`), then the tree sweep of the same build
set -u
cd "$(dirname "$0")/.."
GPU_UPSTREAM=1 GPU_TREE_BUDGETS=15,16,22,23 bash scripts/gpu_run.sh build-lean upstream tree-sweep pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
