#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# The tree patches on CUDA: test-tree-ssm (0025's ops: every node against the chain op over its
# path, against the CPU, a planted off-by-one parent) on an sm_90 build and on a build with Ampere's
# compute_86 PTX only (the driver compiles it for the card at load, so the Ampere path runs here);
# test-tree-decode (0027-0028: a tree decoded in one batch against each node's path, each path
# committed) on the tiny pair in f32 (a quantized pair's batch-size noise hides the controls), offloaded; test-backend-ops' check of both tree ops and of the chain ops beside them; and their
# timings at the 27B's shapes, a chain of 16 against trees of 16, 23 and 32 tokens. ~10-11 min on
# an H200 (the two builds alone took 467 and 581 s with patch 0027): more than one 600 s call, so
# start it detached and poll, as docs/benchmarks.md shows.
. "$(dirname "$0")/gpu_lib.sh"
gpu_vendor

# two CUDA builds side by side (FA kernels for every KV type are not needed here)
B86=$R/vendor/build/cuda86
step build 900 bash -c "cmake -S vendor/llama.cpp -B vendor/build/cuda $CUDA_CMAKE -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > /dev/null \
    && cmake --build vendor/build/cuda -j 10 --target test-tree-ssm test-tree-decode test-backend-ops" &
build_pid=$!
step build86 900 bash -c "cmake -S vendor/llama.cpp -B $B86 $CUDA_CMAKE -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=86-virtual -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > /dev/null \
    && cmake --build $B86 -j 6 --target test-tree-ssm"
wait $build_pid

step tree-ssm 300 "$BIN/test-tree-ssm"
tail -1 "$RES/tree-ssm.log" | tee -a "$RES/summary.txt"
step tree-ssm-86 300 "$B86/bin/test-tree-ssm" -b CUDA0
tail -1 "$RES/tree-ssm-86.log" | tee -a "$RES/summary.txt"
tiny=$(python3 -c "from pathlib import Path; from buun_tool import recipes, synth
print(synth.write_pair(recipes.load(), Path('$W/tiny-f32'), scale='tiny', seed=0, target_type='f32', draft_type='f32')[0])")
step tree-decode 300 "$BIN/test-tree-decode" -m "$tiny" -ngl 99
tail -1 "$RES/tree-decode.log" | tee -a "$RES/summary.txt"

for op in GATED_DELTA_NET_TREE SSM_CONV_TREE GATED_DELTA_NET SSM_CONV; do
    gpu_tbo "$op" "" test -o "$op"
done
for op in GATED_DELTA_NET GATED_DELTA_NET_TREE; do
    gpu_tbo "perf-$op" "" perf -o "$op" -p "head_count=16,head_size=128"
done
for op in SSM_CONV SSM_CONV_TREE; do
    gpu_tbo "perf-$op" "" perf -o "$op" -p "10240"
done

log "done in $SECONDS s"
