#!/usr/bin/env bash
# Record of this run; it no longer runs from here: scripts/gpu_run.sh has its parts.
# Patches 0013-0015 on one H100, one build of the series: 0013's Q6_K in the small-batch kernel
# against GGML_CUDA_MMQ_SMALL=q4_K,q5_K, 0014's split argmax against GGML_CUDA_ARGMAX_SPLIT=0, 0015's
# shared activation quantization against GGML_CUDA_MMQS_SHARE=0 (test-backend-ops eval of each; perf
# of the first two, as perf repeats a test's last node only and cannot time matmuls that share);
# llama-bench pp16 and AR with their ncu windows; the per-phase profile of a DFlash step with the
# series, without each of the three, with the target's sampling on the GPU (-bs, where 0014's argmax
# serves each verified row) and with snapshots; `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31)
# of the series, of -bs and without the three; the correctness harness on CUDA; ncu kernel times of
# a few DFlash steps. Start it detached and poll (see scripts/gpu_session.sh); results in
# /tmp/buun-gpu/results.
. "$(dirname "$0")/gpu_lib.sh"
gpu_prepare

gpu_tbo_build
NOQ6="GGML_CUDA_MMQ_SMALL=q4_K,q5_K"
gpu_tbo q6k "" test -o MUL_MAT -p 'type_a=q6_K,'
gpu_tbo q6k-mmq "$NOQ6" test -o MUL_MAT -p 'type_a=q6_K,'
gpu_tbo q45k "" test -o MUL_MAT -p 'type_a=q[45]_K,'
gpu_tbo shared "" test -o MUL_MAT_SHARED_SRC1
gpu_tbo shared-off GGML_CUDA_MMQS_SHARE=0 test -o MUL_MAT_SHARED_SRC1
gpu_tbo perf-q6k "" perf -o MUL_MAT -p 'type_a=q6_K,type_b=f32,m=(5120|248320),n=16,'
gpu_tbo perf-q6k-mmq "$NOQ6" perf -o MUL_MAT -p 'type_a=q6_K,type_b=f32,m=(5120|248320),n=16,'
gpu_tbo_variants ARGMAX 'ne=\[248320' "argmax|" "argmax-nosplit|GGML_CUDA_ARGMAX_SPLIT=0"

gpu_pp16 noq6 "$NOQ6"
gpu_pp16 all
gpu_ar_bench
gpu_ncu_window ar -p 0 -n 8 -r 1

OFF="$NOQ6 GGML_CUDA_MMQS_SHARE=0"
gpu_profile all
gpu_profile bs -- --server-args -bs
gpu_profile noq6 "$NOQ6"
gpu_profile noshare GGML_CUDA_MMQS_SHARE=0
gpu_profile bs-nosplit GGML_CUDA_ARGMAX_SPLIT=0 -- --server-args -bs
gpu_profile snapshot-all LLAMA_RS_ROLLBACK=snapshot
gpu_benches "tape-all|" "tape-off|$OFF"
step bench-tape-bs 600 $BUUN bench "${BENCH[@]}" --server-args -bs \
    --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-tape-bs"
step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
gpu_ncu_server step-al1 "$RES/profile-all/server-dflash-al1.log"

gpu_pack
log "done in $SECONDS s"
