#!/usr/bin/env bash
# The series against another tree, in one run on a lent GPU machine: this checkout's series
# (patches/) and the same tree with a diff applied (GPU_BASE_DIFF, e.g. the series as it was
# before a change: `git -C vendor/llama.cpp diff HEAD OLD > .carry/base.diff`), both built lean
# (llama-server, llama-bench; f16 KV, so the benches run the kernels the product build runs), and
# `buun bench` of each, interleaved build by build: AR and synthetic AL 1 / 7.67 / 8.31, the tree
# sweep (the chain and budget 22) and four slots (--concurrency 4 at AL 7.67). While the second
# tree builds, the CUDA checks of the series run on the first: test-backend-ops' cases of the
# series' ops against the CPU and test-tree-ssm.
#
#     GPU_BASE_DIFF=.carry/series-before-fold.diff setsid nohup bash scripts/gpu_compare.sh \
#         > /tmp/buun-gpu/driver.log 2>&1 &
#
# Results: $RES (/tmp/buun-gpu/results): summary.txt, bench-{series,base}/, tree-{series,base}/,
# slots-{series,base}/, the test logs. A step that fails is logged and the next one runs.
. "$(dirname "$0")/gpu_lib.sh"

BASE_DIFF=$(realpath "${GPU_BASE_DIFF:?GPU_BASE_DIFF: the diff that makes the other tree}")
BASE_TREE=$W/base/llama.cpp
BASE_BIN=$W/base/build/bin
LEAN="-DGGML_CUDA_FA_ALL_QUANTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

# this checkout's series: llama-server, llama-bench and the CUDA checks' programs; the pair beside
gpu_build_synth 1200 bash -c "cmake -S vendor/llama.cpp -B vendor/build/cuda $CUDA_CMAKE $LEAN -DLLAMA_BUILD_TESTS=ON \
    > /dev/null && cmake --build vendor/build/cuda -j 16 --target llama-server llama-bench test-backend-ops test-tree-ssm"
export BUUN_LLAMA_BIN_DIR=$BIN

# the other tree: a copy of the patched one with the diff applied, built in the background
mkdir -p "$W/base"
rm -rf "$BASE_TREE" && cp -a vendor/llama.cpp "$BASE_TREE"
step base-diff 60 git -C "$BASE_TREE" apply "$BASE_DIFF" || exit 1
step base-build 1200 bash -c "cmake -S $BASE_TREE -B $W/base/build $CUDA_CMAKE $LEAN > /dev/null \
    && cmake --build $W/base/build -j 16 --target llama-server llama-bench" &
base_pid=$!

step tree-ssm 300 "$BIN/test-tree-ssm" -b CUDA0
tail -1 "$RES/tree-ssm.log" | tee -a "$RES/summary.txt"
gpu_tbo mmqs "" test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(1|9|16|17|23|32|33|40|48|57|64),"
gpu_tbo mmqs-shared "" test -o MUL_MAT_SHARED_SRC1
for op in ARGMAX TOP_K CONCAT GATED_DELTA_NET GATED_DELTA_NET_TREE SSM_CONV SSM_CONV_TREE; do
    gpu_tbo "$op" "" test -o "$op"
done
wait $base_pid || { log "the other tree did not build"; exit 1; }

# both KIND ARGS...: `buun bench` of the synthetic pair on this series' build, then on the other
# tree's; results in $RES/KIND-series and $RES/KIND-base
both() {
    local kind=$1 which bin
    shift
    for which in series base; do
        bin=$BIN; [ $which = base ] && bin=$BASE_BIN
        step "$kind-$which" 600 env BUUN_LLAMA_BIN_DIR="$bin" LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" "$@" \
            --out "$RES/$kind-$which"
    done
}
both bench --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512
both tree --no-ar --tree-budget 22 --prompts 2 --n-predict 512
both slots --synthetic-al 7.67 --concurrency 4 --prompts 4 --n-predict 512
log "done"
