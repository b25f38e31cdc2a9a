#!/usr/bin/env bash
# session 32: the small-batch kernel at 2-8 columns in place of MMVQ (patch 0003; issue #48): the
# kernel bench at 1-16 columns beside the build, forwards of 1-8 tokens on the kernel and on MMVQ,
# DFlash2 at AL 1 and 6 against upstream, the kernel's op checks, the DFlash chain's bench and
# three runs of four slots (~24 min on 16 cores; summary.txt has each bench's table).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
RES=/tmp/buun-gpu/results
mkdir -p "$RES"
GPU_UPSTREAM=1 bash scripts/gpu_run.sh build-lean widths-mmvq dflash2 tbo-mmqs2 bench &
main=$!
# the kernel bench needs the patched tree alone: it runs while the builds do
for _ in $(seq 300); do grep -q "end vendor" "$RES/summary.txt" 2>/dev/null && break; sleep 2; done
g=vendor/llama.cpp/ggml
nvcc -O3 -std=c++17 -arch=sm_90 -I$g/include -I$g/src -I$g/src/ggml-cuda scripts/cuda/mmqs_bench.cu \
    -o /tmp/buun-gpu/mmqs-bench -Xlinker --unresolved-symbols=ignore-all > "$RES/mmqs-bench-build.log" 2>&1 &&
    MMQS_BENCH_NS=1,2,4,8,16 /tmp/buun-gpu/mmqs-bench > "$RES/mmqs-bench.txt" 2>&1
echo "[$(date +%T)] mmqs-bench rc=$?" >> "$RES/summary.txt"
wait $main
for k in 1 2 3; do
    bash scripts/gpu_run.sh slots-bench && mv "$RES/slots-bench" "$RES/slots-bench-$k"
done
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> "$RES/summary.txt"
