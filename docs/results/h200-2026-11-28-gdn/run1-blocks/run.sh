# run 1 (one H200, 2026-11-28), the series to 0044; .carry/gdn-tables held gdn-tables.diff
# applied. 0044 in DFlash steps (GGML_CUDA_GDN_BLOCKS on, off, on: the verify's profile and the
# bench), the tree-ops check of 0043/0044, tree-decode, the recorded sweep and the tree's memory.
set -u
export W=/tmp/buun-gpu
R=$W/results
bash scripts/gpu_run.sh build-lean tree-ops tree-decode > $W/driver1.log 2>&1
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
# the tree form's tables without a loop over each token's later tokens (gdn-tables.diff), alone
GPU_GDN_SRC=.carry/gdn-tables bash scripts/gpu_run.sh gdn-bench > $W/driver-gdn.log 2>&1
for v in 1 0 1b; do
  GGML_CUDA_GDN_BLOCKS=${v%b} bash scripts/gpu_run.sh bench > $W/driver-b$v.log 2>&1
  mv $R/bench $R/bench-g$v; mv $R/bench.log $R/bench-g$v.log
done
GPU_TREE_BUDGETS=15,16,22,32 bash scripts/gpu_run.sh tree-sweep fit-tree > $W/driver-sweep.log 2>&1
bash scripts/gpu_run.sh pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
