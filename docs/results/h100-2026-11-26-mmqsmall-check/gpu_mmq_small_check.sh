#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patch 0009's kernel against the CPU backend at the model's shapes: test-backend-ops MUL_MAT for
# q4_K on CUDA (the cases 0009 adds: 9-16 columns, many K blocks, rows off the 16-row tile, 4, 8
# and 16 warps a block), with the kernel and with MMQ (GGML_CUDA_MMQ_SMALL=0); then the same
# cases with a planted bug (the warps' partial sums not added), which must fail. Builds only
# test-backend-ops (CUDA, sm_90). Start it detached and poll (see scripts/gpu_session.sh).
. "$(dirname "$0")/gpu_lib.sh"
gpu_vendor
B=vendor/build/cuda-tbo
step tbo-build 1500 bash -c "cmake -S vendor/llama.cpp -B $B $CUDA_CMAKE -DLLAMA_BUILD_TESTS=ON > /dev/null \
    && cmake --build $B -j 16 --target test-backend-ops" || exit 1
TBO="$B/bin/test-backend-ops test -o MUL_MAT -b CUDA0 -p type_a=q4_K,"
step tbo-small 600 $TBO
tail -1 "$RES/tbo-small.log" | tee -a "$RES/summary.txt"
step tbo-mmq 600 env GGML_CUDA_MMQ_SMALL=0 $TBO
tail -1 "$RES/tbo-mmq.log" | tee -a "$RES/summary.txt"
K=vendor/llama.cpp/ggml/src/ggml-cuda/mmq-small.cu
sed -i 's/acc\[i\/4\]\[i%4\] += partial\[w\]\[i\]\[lane\];/acc[i\/4][i%4] += 0.0f*partial[w][i][lane];/' "$K"
grep -c "0.0f\*partial" "$K" | tee -a "$RES/summary.txt"
step tbo-planted-build 600 cmake --build $B -j 16 --target test-backend-ops
step tbo-planted 600 $TBO
grep -c "FAIL" "$RES/tbo-planted.log" | tee -a "$RES/summary.txt"
git -C vendor/llama.cpp checkout -- ggml/src/ggml-cuda/mmq-small.cu
gpu_pack
log "done in $SECONDS s"
