#!/usr/bin/env bash
# session 25, call 2: the f16 experiment (.carry/f16k: Q4_K dequantized to f16, m16n8k16 MMAs)
# beside the product's small-batch kernel, at 16-24 columns, native and as compute_86 PTX
set -u
cd "$(dirname "$0")/.."
export GPU_MMQS_SRC=$PWD/.carry/f16k MMQS_BENCH_NS=16,17,23,24 MMQS_BENCH_M=17408,5120,10240
export MMQS_BENCH_ONLY=v1,v2-nt2-b4-pf0-ld1,v2-nt3-b3-pf0-ld1,f16-nt2-r1-ld1,f16-nt2-r2-ld1,f16-nt3-r1-ld1,f16-nt3-r2-ld1,f16-nt3-r1-ld0,f16-nt4-r1-ld1,read,compute-nt2,compute-nt4
bash scripts/gpu_run.sh mmqs-bench mmqs-bench-86 pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
