#!/usr/bin/env bash
# session 23, call 3: the series to 0047 (0046 with a tree's kernel at 12 blocks at every width, as
# first written; 0047), one H200: the delta net's kernel against 0045's (gdn-bench, GPU_GDN_SRC
# holding 0045's gated_delta_net.cu) with a tree's kernel at 12 and at 2 blocks, the lean build,
# the tree ops and the small-batch kernel (3 warps forced) against the CPU, the tree sweep and the
# bench, then the sweep with 0046's and 0047's switches off
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
mvres() {  # mvres PREFIX PATH...: results renamed PREFIX-NAME
    local p=$1 f
    shift
    for f in "$@"; do [ -e "$f" ] && mv "$f" "$(dirname "$f")/$p-$(basename "$f")"; done
}
GPU_GDN_SRC=$PWD/.carry/gdn-old bash scripts/gpu_run.sh gdn-bench
mvres t12 "$RES"/gdn-bench*
GGML_CUDA_GDN_TREE_BLOCKS=2 GPU_GDN_SRC=$PWD/.carry/gdn-old bash scripts/gpu_run.sh gdn-bench
mvres t2 "$RES"/gdn-bench*
bash scripts/gpu_run.sh build-lean tree-ops
GGML_CUDA_MMQS_NWARPS=3 bash scripts/gpu_run.sh tbo-mmqs2
mvres w3 "$RES"/tbo-mmqs2* "$RES"/tbo-perf-mmqs2* "$RES"/*mmqs2*.log
GPU_TREE_BUDGETS=15,16,22 bash scripts/gpu_run.sh tree-sweep bench
mvres on "$RES"/tree-sweep "$RES"/tree-sweep.log
GGML_CUDA_GDN_TREE_BLOCKS=2 GGML_CUDA_MMQS_WAVES=0 GPU_TREE_BUDGETS=15,22 bash scripts/gpu_run.sh tree-sweep
mvres off "$RES"/tree-sweep "$RES"/tree-sweep.log
bash scripts/gpu_run.sh pack
