#!/usr/bin/env bash
# session 33: the series with patch 0003's one-tile path at 2-8 columns (8794d98) built for Ampere's
# compute_86 as PTX only (the driver compiles it for the H200 at load: the code a 3090 gets), for
# issue #48: the DFlash2 harness, the kernel's MUL_MAT cases against the CPU, the kernel bench as
# compute_86 PTX beside the build, then the whole CUDA harness.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
export GPU_CUDA_ARCH=86-virtual CUDA_CACHE_MAXSIZE=4294967296
RES=/tmp/buun-gpu/results
mkdir -p "$RES"
bash scripts/gpu_run.sh build-lean dflash2-harness tbo-mmqs2 correctness &
main=$!
for _ in $(seq 300); do grep -q "end vendor" "$RES/summary.txt" 2>/dev/null && break; sleep 2; done
g=vendor/llama.cpp/ggml
nvcc -O3 -std=c++17 -arch=compute_86 -I$g/include -I$g/src -I$g/src/ggml-cuda scripts/cuda/mmqs_bench.cu \
    -o /tmp/buun-gpu/mmqs-bench-86 -Xlinker --unresolved-symbols=ignore-all > "$RES/mmqs-bench-86-build.log" 2>&1 &&
    MMQS_BENCH_NS=1,2,4,8,16 /tmp/buun-gpu/mmqs-bench-86 > "$RES/mmqs-bench-86.txt" 2>&1
echo "[$(date +%T)] mmqs-bench-86 rc=$?" >> "$RES/summary.txt"
wait $main
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> "$RES/summary.txt"
# the second call, in the same lease, on a fresh copy with the sm_90 lean build: `buun tune` of the
# DFlash2 recipe on its full-size synthetic pair (summary.txt's second part, tune-dflash2/tune.json):
# W=/tmp/buun-gpu2 GPU_TUNE_BUDGET_S=240 bash scripts/gpu_run.sh build-lean tune-dflash2 pack
