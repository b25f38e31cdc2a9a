# NEXT SESSION (prepared 2026-11-28): 0043's tree path, variant 2 (follow a parent by shifting the
# window in registers, gather from L1 only at a branch's first token; .carry/conv3/ssm-conv.cu,
# GGML_CUDA_SSM_CONV_SHORT=2) against 0043's (=1, row in local memory), one build
set -u
export W=/tmp/buun-gpu
R=$W/results
bash scripts/gpu_run.sh build-lean > $W/driver1.log 2>&1
cp .carry/conv3/ssm-conv.cu vendor/llama.cpp/ggml/src/ggml-cuda/ssm-conv.cu
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
(time cmake --build vendor/build/cuda -j 16 --target llama-server) > $R/rebuild3.log 2>&1
GGML_CUDA_SSM_CONV_SHORT=2 bash scripts/gpu_run.sh tree-ops > $W/driver2.log 2>&1
GGML_CUDA_SSM_CONV_SHORT=2 $BUUN_LLAMA_BIN_DIR/test-backend-ops perf -b CUDA0 -o SSM_CONV_TREE -p 10240 > $R/tbo-perf-SSM_CONV_TREE-short2.log 2>&1
grep "us/run" $R/tbo-perf-SSM_CONV_TREE-short2.log >> $R/summary.txt
for v in 1 2 1b 2b; do
  GGML_CUDA_SSM_CONV_SHORT=${v%b} GPU_TREE_BUDGETS=15,22 bash scripts/gpu_run.sh tree-sweep > $W/driver-s$v.log 2>&1
  mv $R/tree-sweep $R/tree-sweep-s$v; mv $R/tree-sweep.log $R/tree-sweep-s$v.log
done
GGML_CUDA_SSM_CONV_SHORT=2 GPU_TREE_BUDGETS=16,22,32 bash scripts/gpu_run.sh tree-sweep > $W/driver-s2full.log 2>&1
mv $R/tree-sweep $R/tree-sweep-s2full; mv $R/tree-sweep.log $R/tree-sweep-s2full.log
GGML_CUDA_SSM_CONV_SHORT=2 bash scripts/gpu_run.sh bench > $W/driver-bench.log 2>&1
bash scripts/gpu_run.sh pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
