#!/usr/bin/env bash
# session 26, second lease: the tree at the chain's width (budget 15) and at budget 22 against the
# chain, three sweeps in one run of one build (the series to 0048), for the spread of the ratios
set -u
cd "$(dirname "$0")/.."
R=/tmp/buun-gpu/results
bash scripts/gpu_run.sh build-lean
for i in 1 2 3; do
    GPU_TREE_BUDGETS=15,22 bash scripts/gpu_run.sh tree-sweep
    mv "$R/tree-sweep" "$R/tree-sweep-$i"; mv "$R/tree-sweep.log" "$R/tree-sweep-$i.log"
done
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> $R/summary.txt
