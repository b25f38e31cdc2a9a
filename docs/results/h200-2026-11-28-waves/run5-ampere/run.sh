#!/usr/bin/env bash
# session 23, call 5: the Ampere path (compute_86 PTX, JIT-compiled for this card) of 0047's blocks
# of 3 warps (mmqs-bench-86 with the warps variants) and of 0046's delta net (gdn-bench built for
# compute_86, its outputs against the native build's)
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
W=/tmp/buun-gpu
GPU_MMQS_SRC=$PWD/.carry/mmqs-w MMQS_BENCH_NS=1,8,16 MMQS_BENCH_ONLY=v1,v2-nt2-b4-pf0-ld1,w3-nt2-b5 \
    bash scripts/gpu_run.sh mmqs-bench-86
bash scripts/gpu_run.sh gdn-bench
g=vendor/llama.cpp/ggml
nvcc -O3 -std=c++17 -arch=compute_86 -I$g/include -I$g/src -I$g/src/ggml-cuda scripts/cuda/gdn_bench.cu \
    -o $W/gdn-bench-86 -Xlinker --unresolved-symbols=ignore-all > $RES/gdn-bench-86-build.log 2>&1
$W/gdn-bench-86 $W/gdn-bench-86.bin > $RES/gdn-bench-86.txt 2>&1
if cmp -s $W/gdn-bench.bin $W/gdn-bench-86.bin; then r=equal; else r=differ; fi
echo "gdn-bench-86: outputs $r to the native build's" >> $RES/summary.txt
tar czf $W/results.tgz -C $W results
echo "ALLDONE" >> "$RES/summary.txt"
