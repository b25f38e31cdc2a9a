# run 2 (a second H200 lease, 2026-11-28): the series with 0025's tables in one pass (gdn-tables.diff of run 1,
# folded into 0025): the tree ops' checks, tree-decode, the kernel bench, a sweep
set -u
export W=/tmp/buun-gpu
bash scripts/gpu_run.sh build-lean tree-ops tree-decode > $W/driver1.log 2>&1
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
bash scripts/gpu_run.sh gdn-bench > $W/driver-gdn.log 2>&1
GPU_TREE_BUDGETS=15,16,22 bash scripts/gpu_run.sh tree-sweep > $W/driver-sweep.log 2>&1
bash scripts/gpu_run.sh pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
