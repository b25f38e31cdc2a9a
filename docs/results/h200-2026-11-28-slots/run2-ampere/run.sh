#!/usr/bin/env bash
# session 24, call 2: the Ampere path of patch 0048: the delta net's kernel bench built for
# compute_86 (PTX only, which the driver compiles for this card at load) against the native build,
# outputs compared bit for bit, with 4 shared slots (the patch) and with every state in global memory
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
W=/tmp/buun-gpu
mkdir -p $RES
bash scripts/gpu_run.sh gdn-bench
g=vendor/llama.cpp/ggml
nvcc -O3 -std=c++17 -arch=compute_86 -I$g/include -I$g/src -I$g/src/ggml-cuda scripts/cuda/gdn_bench.cu \
    -o $W/gdn-bench-86 -Xlinker --unresolved-symbols=ignore-all > $RES/gdn-bench-86-build.log 2>&1
for s in 4 0; do
    GGML_CUDA_GDN_SHARED_SLOTS=$s $W/gdn-bench $W/native-s$s.bin > $RES/gdn-bench-native-s$s.txt 2>&1
    GGML_CUDA_GDN_SHARED_SLOTS=$s $W/gdn-bench-86 $W/86-s$s.bin > $RES/gdn-bench-86-s$s.txt 2>&1
    if cmp -s $W/native-s$s.bin $W/86-s$s.bin; then r=equal; else r=differ; fi
    echo "gdn-bench-86, $s shared slots: outputs $r to the native build's" >> $RES/summary.txt
done
tar czf $W/results.tgz -C $W results
echo "ALLDONE" >> "$RES/summary.txt"
