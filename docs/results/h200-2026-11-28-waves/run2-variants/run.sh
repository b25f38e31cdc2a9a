#!/usr/bin/env bash
# session 23, call 2: the delta net's tree kernel with per-token bit masks for its tables (mk, not
# kept), at 2 and 12 blocks an SM (GDN_TREE_BLOCKS=12, the variant's own switch), saved states in
# shared and in global memory; the small-batch kernel with other warps a block (mmqs_bench_extra.h)
set -u
cd "$(dirname "$0")/.."
RES=/tmp/buun-gpu/results
W=/tmp/buun-gpu
run_gdn() {  # run_gdn NAME ENV...: gdn-bench of the series and of gdn-mk, results prefixed NAME-
    local name=$1
    shift
    env "$@" GPU_GDN_SRC=$PWD/.carry/gdn-mk bash scripts/gpu_run.sh gdn-bench
    for f in "$RES"/gdn-bench*; do mv "$f" "$RES/$name-$(basename "$f")"; done
}
run_gdn mk X=1
run_gdn mk12 GDN_TREE_BLOCKS=12
run_gdn mk12g GDN_TREE_BLOCKS=12 GDN_BENCH_SLOTS=global
ONLY=v2-nt2-b4-pf0-ld1,v2-nt3-b3-pf0-ld1,w2-nt2-b8,w3-nt2-b5,w6-nt2-b2,w8-nt2-b2,w16-nt2-b1,w2-nt3-b6,w3-nt3-b4,w6-nt3-b2,w8-nt3-b2,w12-nt3-b1
GPU_MMQS_SRC=$PWD/.carry/mmqs-w MMQS_BENCH_NS=16,17,23,24 MMQS_BENCH_ONLY=$ONLY bash scripts/gpu_run.sh mmqs-bench
# then ncu as in run1-ncu/run.sh: the variant's tree of 16 at 2 and 12 blocks (shared and global
# slots), w8-nt2-b2 at 16 columns and w6-nt3-b2 at 23 (Q4_K 17408 x 5120)
