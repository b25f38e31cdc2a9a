#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# A quick look at a change to patch 0009's kernel, for a session with little device time left:
# builds only test-backend-ops and llama-bench (CUDA, sm_90) and the full-size synthetic target,
# then test-backend-ops MUL_MAT for q4_K, llama-bench pp16 and the ncu per-kernel window of a
# 16-token batch, with the kernel and with MMQ (GGML_CUDA_MMQ_SMALL=0). No DFlash runs.
# Start it detached and poll (see scripts/gpu_session.sh); results in /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_vendor
B=vendor/build/cuda-quick
BIN=$R/$B/bin
step build 1500 bash -c "cmake -S vendor/llama.cpp -B $B $CUDA_CMAKE -DLLAMA_BUILD_TESTS=ON > /dev/null \
    && cmake --build $B -j 16 --target test-backend-ops llama-bench" &
build_pid=$!
step synth 600 $BUUN synth --scale full --target-type q4_k_m --draft-type q4_k
wait $build_pid || { log "build failed"; exit 1; }
TARGET=$(ls "$BUUN_MODELS_DIR"/synthetic/synth-*-full-q4_k_m.gguf)
step tbo-small 600 "$BIN/test-backend-ops" test -o MUL_MAT -b CUDA0 -p 'type_a=q4_K,'
tail -1 "$RES/tbo-small.log" | tee -a "$RES/summary.txt"
gpu_pp16 mmq GGML_CUDA_MMQ_SMALL=0
gpu_pp16 small
gpu_pack
log "done in $SECONDS s"
