# 2026-11-28 run 4: the CUDA harness and tree-decode on the series with 0043 as folded, then the
# short conv's max_t-16 instance (conv4, GGML_CUDA_SSM_CONV_SHORT=3) against 0043's (=1), alone
set -u
export W=/tmp/buun-gpu
R=$W/results
bash scripts/gpu_run.sh build-lean correctness tree-decode > $W/driver1.log 2>&1
cp .carry/conv4/ssm-conv.cu vendor/llama.cpp/ggml/src/ggml-cuda/ssm-conv.cu
bash scripts/gpu_run.sh tree-ops > $W/driver2.log 2>&1
B=$PWD/vendor/build/cuda/bin
for v in 3 1 3; do
  for op in SSM_CONV SSM_CONV_TREE; do
    GGML_CUDA_SSM_CONV_SHORT=$v $B/test-backend-ops perf -b CUDA0 -o $op -p 10240 > $R/tbo-perf-$op-v$v.log 2>&1
    echo "v$v $op" >> $R/summary.txt; grep "us/run" $R/tbo-perf-$op-v$v.log >> $R/summary.txt
  done
done
for op in SSM_CONV SSM_CONV_TREE; do
  GGML_CUDA_SSM_CONV_SHORT=3 $B/test-backend-ops test -b CUDA0 -o $op > $R/tbo-$op-v3.log 2>&1
  echo "v3 test $op: $(tail -1 $R/tbo-$op-v3.log)" >> $R/summary.txt
done
GGML_CUDA_SSM_CONV_SHORT=3 $B/test-tree-ssm > $R/tree-ssm-v3.log 2>&1
echo "v3 tree-ssm: $(tail -1 $R/tree-ssm-v3.log)" >> $R/summary.txt
bash scripts/gpu_run.sh pack > $W/driver-pack.log 2>&1
touch $W/ALLDONE
