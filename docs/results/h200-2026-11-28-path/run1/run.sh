#!/usr/bin/env bash
# session 22: the series to 0045 on CUDA (harness, bench, tree sweep), then the delta net's tree
# kernel at 12 blocks an SM with its saved states in shared and in global memory (gdn-bench)
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
export GPU_TREE_BUDGETS=15,16,22,23
bash scripts/gpu_run.sh build-lean correctness bench tree-sweep
for slots in shared global; do
    GDN_BENCH_SLOTS=$slots GPU_GDN_SRC=$PWD/.carry/gdn-t12 bash scripts/gpu_run.sh gdn-bench
    for f in "$RES"/gdn-bench*; do mv "$f" "$RES/$slots-$(basename "$f")"; done
done
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> "$RES/summary.txt"
