# run 1 (2026-11-28): the first version of 0043 (the rows staged through shared memory,
# staged.diff; its switch was GGML_CUDA_SSM_CONV_STAGED), the fold variant in the kernel bench
set -u
export W=/tmp/buun-gpu
R=$W/results
GPU_MMQS_SRC=.carry/fold bash scripts/gpu_run.sh build-lean mmqs-bench tree-ops > $W/driver1.log 2>&1
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
for v in 0 1; do
  GGML_CUDA_SSM_CONV_STAGED=$v GPU_TREE_BUDGETS=15,16,22 bash scripts/gpu_run.sh bench tree-sweep > $W/driver-s$v.log 2>&1
  for p in bench tree-sweep; do mv $R/$p $R/$p-s$v; mv $R/$p.log $R/$p-s$v.log; done
done
bash scripts/gpu_run.sh correctness pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
