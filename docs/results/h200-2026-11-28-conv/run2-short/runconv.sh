# 0043 (the short conv's rows loaded at once) on one card: build, the tree ops (tests; the conv's
# timings off and on), then the chain and a budget-22 tree with 0043 on, off, on
set -u
export W=/tmp/buun-gpu
R=$W/results
bash scripts/gpu_run.sh build-lean tree-ops > $W/driver1.log 2>&1
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
for v in 1 0 1b; do
  GGML_CUDA_SSM_CONV_SHORT=${v%b} GPU_TREE_BUDGETS=22 bash scripts/gpu_run.sh tree-sweep > $W/driver-s$v.log 2>&1
  mv $R/tree-sweep $R/tree-sweep-s$v; mv $R/tree-sweep.log $R/tree-sweep-s$v.log
done
bash scripts/gpu_run.sh pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
