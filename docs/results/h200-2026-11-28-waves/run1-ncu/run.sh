#!/usr/bin/env bash
# session 23, call 1: hardware counters (ncu) of the delta net's chain and tree kernels and of the
# small-batch kernel at 2 and 3 column tiles (the series to 0045); the delta net's tree kernel
# without its prologue (np: every token follows the previous one, no table built from the parents)
# and with __restrict__ pointers (rs), as gdn-bench variants (GPU_GDN_SRC folders, not kept)
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
W=/tmp/buun-gpu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
bash scripts/gpu_run.sh gdn-bench
for v in np rs; do
    GPU_GDN_SRC=$PWD/.carry/gdn-$v bash scripts/gpu_run.sh gdn-bench
    for f in "$RES"/gdn-bench-variant*; do mv "$f" "$RES/$v-$(basename "$f")"; done
done
MMQS_BENCH_NS=16,17,23,24 bash scripts/gpu_run.sh mmqs-bench
prof() {  # prof NAME KERNEL_REGEX CACHE CMD...: ncu --set full of one launch (the 21st) of the kernel
    local name=$1 k=$2 cc=$3
    shift 3
    timeout 240 "$NCU" --clock-control none --cache-control $cc --set full --import-source no -k "regex:$k" \
        --launch-skip 20 --launch-count 1 -o "$W/$name" -f "$@" > "$RES/ncu-$name.log" 2>&1
    "$NCU" -i "$W/$name.ncu-rep" --page details > "$RES/ncu-$name.txt" 2>&1
    "$NCU" -i "$W/$name.ncu-rep" --page source --csv --print-source sass > "$RES/ncu-$name-sass.csv" 2>&1
}
for c in chain16 tree16 chain23 tree23; do
    GDN_BENCH_CASES=$c prof gdn-$c gated_delta none "$W/gdn-bench" "$W/x.bin" 40
done
GGML_CUDA_GDN_BLOCKS=0 GDN_BENCH_CASES=chain16 prof gdn-chain16-b2 gated_delta none "$W/gdn-bench" "$W/x.bin" 40
for n in 16 23; do
    nt=$([ $n = 16 ] && echo 2 || echo 3); b=$([ $n = 16 ] && echo 4 || echo 3)
    MMQS_BENCH_M=17408 MMQS_BENCH_NS=$n MMQS_BENCH_ONLY=v2-nt$nt-b$b-pf0-ld1 prof mmqs-$n mul_mat_k_small2 all "$W/mmqs-bench" 40
done
