#!/usr/bin/env bash
# session 24: patch 0048 (a tree's delta net keeps up to 4 saved states in shared memory), one H200:
# the kernel bench with its shared slots at 4 (the patch), 64 (0025's layout) and 0 (all global),
# outputs compared bit for bit; the lean build, the tree ops against the CPU, the tree sweep with
# 0048 on and off (GGML_CUDA_GDN_SHARED_SLOTS=64), the bench, the CUDA harness
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
W=/tmp/buun-gpu
mvres() {  # mvres PREFIX PATH...: results renamed PREFIX-NAME
    local p=$1 f
    shift
    for f in "$@"; do [ -e "$f" ] && mv "$f" "$(dirname "$f")/$p-$(basename "$f")"; done
}
for s in 64 0 4; do
    GGML_CUDA_GDN_SHARED_SLOTS=$s bash scripts/gpu_run.sh gdn-bench
    mvres "s$s" "$RES"/gdn-bench*
    cp $W/gdn-bench.bin $W/s$s.bin
done
for s in 64 0; do
    if cmp -s $W/s4.bin $W/s$s.bin; then r=equal; else r=differ; fi
    echo "gdn-bench: shared slots 4 against $s: outputs $r" >> $RES/summary.txt
done
bash scripts/gpu_run.sh build-lean tree-ops
GPU_TREE_BUDGETS=15,16,22 bash scripts/gpu_run.sh tree-sweep
mvres on "$RES"/tree-sweep "$RES"/tree-sweep.log
GGML_CUDA_GDN_SHARED_SLOTS=64 GPU_TREE_BUDGETS=15,22 bash scripts/gpu_run.sh tree-sweep
mvres off "$RES"/tree-sweep "$RES"/tree-sweep.log
bash scripts/gpu_run.sh bench correctness pack
tar czf $W/results.tgz -C $W results
echo "ALLDONE" >> "$RES/summary.txt"
