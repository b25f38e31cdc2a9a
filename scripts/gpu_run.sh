#!/usr/bin/env bash
# The GPU driver: the named parts, in order, on a lent H100/H200 machine, from a copy of the
# checkout (CUDA, no internet; .carry/ and .whl/ as gpu_lib.sh says):
#
#     bash scripts/gpu_run.sh PART...
#     bash scripts/gpu_run.sh build tree-ops ampere tree-decode pack           # the tree ops on CUDA
#     bash scripts/gpu_run.sh build correctness ar upstream fit setup pack     # buun against upstream
#     GPU_VARIANTS="all|;rows0|LLAMA_SAMPLER_ROWS=0" bash scripts/gpu_run.sh build correctness ar variants pack
#
# A run outlasts one 10-minute device command: start it detached and poll (docs/benchmarks.md).
# Each step's log is in $RES (/tmp/buun-gpu/results), its exit code and time in summary.txt. Every
# part after build runs on what build left (the patched tree, the CUDA build, the synthetic pair).
#   build        vendor + patch, the product CUDA build for the machine's own GPU (`buun build
#                --cuda`: the arch comes from nvidia-smi) while the full-size synthetic pair is written
#   build-lean   build with little device time left: llama-server and llama-bench only, no FA kernels
#                for quantized KV caches (gpu_prepare_lean; ~4 min on 16 cores), then the parts that
#                need no more (correctness, ar, widths, bench at f16 KV)
#   tbo-mmqs     test-backend-ops: the small-batch K-quant kernel's MUL_MAT cases (9-32 columns)
#                against the CPU, and its timings at the 27B's FFN shapes, 16 against 17-32 columns
#   mmqs-bench   the small-batch kernel on its own (scripts/cuda/mmqs_bench.cu): each configuration
#                it launches (2, 3 or 4 column tiles a pass, 3, 4 or 8 warps a block) against a
#                float reference, and its time per launch at the 27B's shapes, 1-64 columns, weights
#                from DRAM, beside bounds of its work and its reads; needs no build (GPU_MMQS_SRC: a
#                folder whose mmq-small.cu stands in for the patched tree's, a kernel not in the
#                series yet)
#   mmqs-bench-86  the same built for Ampere's compute_86 as PTX only (the driver compiles it for
#                this card at load, so the code a 3090 gets runs here; its timings are not this
#                card's own code's)
#   gdn-bench    the gated delta net's kernel on its own (scripts/cuda/gdn_bench.cu): its time per
#                launch for a chain and a tree of 1-32 tokens at the 27B's shapes, twice; with
#                GPU_GDN_SRC (a folder holding a variant's gated_delta_net.cu) the variant's too, and
#                whether its outputs equal the series' to the bit
#   tbo-mmqs2    test-backend-ops: the small-batch kernel's MUL_MAT cases of 1-64 columns (also
#                several sequences' tokens in three and four dimensions) and the shared quantizations
#                against the CPU, and its timings at the 27B's FFN shapes (8, 16, 23, 32 and 64 columns)
#   tbo-ops      test-backend-ops: ARGMAX, TOP_K and CONCAT against the CPU (the series' kernels for
#                long and short rows), and MUL_MAT at 9-16 columns through MMQ's tiles (the small-batch
#                kernel off)
#   tree-ops     test-tree-ssm (the tree ops: every node against the chain op over its path, against
#                the CPU, a planted off-by-one parent) and test-backend-ops' check of both tree ops
#                and of the chain ops beside them, with their timings at the 27B's shapes (a chain
#                of 16 against trees of 16, 23 and 32 tokens, and the short conv's)
#   ampere       test-tree-ssm and test-backend-ops' check of those ops, built again for Ampere's
#                compute_86 as PTX only (the driver compiles it for this card at load, so the
#                Ampere path of the kernels runs here); a second CUDA build, ~10 min
#   correctness  the correctness harness on CUDA (tests/test_correctness.py and tests/test_slots.py,
#                tie-aware rule)
#   tree-decode  test-tree-decode on the tiny pair in f32, offloaded (a tree decoded in one batch: each
#                token's logits against its path's, the server's walk)
#   ar           llama-bench tg128 of the target: the run's AR anchor
#   widths       llama-bench pp N of the target, one sequence: what a forward of N tokens costs (a
#                chain's verify 16, a budget-22 tree's 23, two slots' 32, four slots' 64)
#   widths-mmvq  llama-bench pp 1, 2, 4 and 8 of the target: forwards of 2-8 tokens on the small-batch
#                kernel, then on upstream's MMVQ (GGML_CUDA_MMQ_SMALL=0); one token takes MMVQ in both
#   bench        `buun bench`: AR, and DFlash chains at synthetic AL 1 / 7.67 / 8.31, with the
#                per-phase step profile (LLAMA_SPEC_PROFILE=1)
#   upstream     `buun build --upstream` (the unpatched pin, the same flags), then the bench's
#                configurations on both builds (`buun bench --against upstream`): buun over upstream
#   variants     the per-phase profile and `buun bench` of each variant of GPU_VARIANTS, interleaved,
#                twice (gpu_variants): "NAME|VAR=VALUE ...[|SERVER_ARGS];NAME|...", e.g.
#                GPU_VARIANTS="all|;rows0|LLAMA_SAMPLER_ROWS=0"; the profiles alone with
#                GPU_VARIANTS_NO_BENCH=1
#   tree-sweep   `buun bench --tree-budget 16,22,32` (the chain added) under the calibrated tree
#                profile, with the step profile (GPU_TREE_BUDGETS=15,16,22,32: other budgets)
#   fit          `buun fit --measure` of AR, of the recipe's DFlash, of it with the drafter's context
#                as -c (upstream's, --ctx-draft 0), and the fit on a 24 GiB card
#   fit-tree     `buun fit --measure` of the chain and of a budget-22 tree
#   setup        `buun setup` end to end with CUDA (tests/test_setup.py's first test: the tests'
#                local Hub and tiny pair, converted with this machine's own torch and transformers)
#   slots-bench  `buun bench --concurrency 4` at synthetic AL 7.67: AR and DFlash with one request at
#                a time and with four at once on four slots (the issue-24 ratios), with the step profile
#                (GPU_CONCURRENCY=4,8 adds eight; GPU_SLOTS_PROMPTS, GPU_SLOTS_N: prompts and tokens)
#   fit-slots    `buun fit --slots N --measure` for 1, 2 and 4 slots: what each slot costs, measured
#   split        two cards: the harness and the bench with the target split over cards 0 and 1
#   rpc          two cards: the same with card 1 behind an RPC worker (ggml-rpc-server) on this host
#   fit-split    two cards: `buun fit --measure` of card 0 alone and of the split over 0 and 1 as `buun
#                serve --gpus 0,1` plans it (each card's buffers and nvidia-smi against the plan)
#   tune         `buun tune` of the synthetic pair under the calibrated profile, then a `buun bench`
#                sweep of the same configurations and workload (scripts/tune_vs_sweep.py: the tune's
#                pick against the sweep's fastest), then a tune under a profile where trees gain
#                (GPU_TUNE_PROFILE, default 0.2:0: a tree of 22 accepts ~1.5x the chain's)
#   long         `buun bench --suite long` (prompts of 8192 and 30720 tokens) of AR and DFlash at
#                synthetic AL 7.67, with the step profile: prefill and decode against AR's
#   dflash2      the DFlash2 recipe (qwen3.8-27b-dflash2): its full-size synthetic pair (the drafter
#                as Q4_K and as Q8_0), `buun bench` of AR and DFlash2 at synthetic AL 1 and 6 on this
#                build and upstream's (`--against upstream`; GPU_UPSTREAM=1 builds it beside build's),
#                the Q8_0 drafter at AL 6, and tests/test_dflash2.py's harness on CUDA
#   dflash2-harness  tests/test_dflash2.py's harness on CUDA alone (no synthetic pair)
#   tune-dflash2 `buun tune` of the DFlash2 recipe on its full-size synthetic pair
#   pack         $W/results.tgz: what the docs keep of the run
. "$(dirname "$0")/gpu_lib.sh"

part_build() {
    gpu_prepare
}

part_build_lean() {
    gpu_prepare_lean
}

part_tbo_mmqs() {
    gpu_tbo_build
    gpu_tbo mmqs "" test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(9|16|17|23|32),"
    gpu_tbo perf-mmqs "" perf -o MUL_MAT -p "type_a=q[46]_K,type_b=f32,m=(17408|5120),n=(16|17|23|32),k=(5120|17408),"
}

# mmqs_bench NAME ARCH: the kernel bench built for ARCH (nvcc's -arch), its CSV in $RES/NAME.txt
mmqs_bench() {
    local name=$1 arch=$2 g=vendor/llama.cpp/ggml inc=()
    [ -d vendor/llama.cpp/ggml ] || gpu_vendor
    [ -z "${GPU_MMQS_SRC:-}" ] || inc=(-I "$GPU_MMQS_SRC")
    step "$name-build" 600 nvcc -O3 -std=c++17 -arch="$arch" "${inc[@]}" -I$g/include -I$g/src -I$g/src/ggml-cuda \
        scripts/cuda/mmqs_bench.cu -o "$W/$name" -Xlinker --unresolved-symbols=ignore-all -Xptxas -v || return 1
    step "$name" 600 "$W/$name"
    cp "$RES/$name.log" "$RES/$name.txt"  # the poll's partial results take .txt
}

# gdn_bench NAME [-I VARIANT]: the delta net's kernel bench built for this card (a variant's
# gated_delta_net.cu first where given), run twice: its CSVs in $RES/NAME-1.txt, NAME-2.txt, its
# outputs in $W/NAME.bin
gdn_bench() {
    local name=$1 g=vendor/llama.cpp/ggml i
    shift
    step "$name-build" 300 nvcc -O3 -std=c++17 -arch="sm_$CUDA_ARCH" "$@" -I$g/include -I$g/src -I$g/src/ggml-cuda \
        scripts/cuda/gdn_bench.cu -o "$W/$name" -Xlinker --unresolved-symbols=ignore-all -Xptxas -v || return 1
    for i in 1 2; do
        step "$name-$i" 300 "$W/$name" "$W/$name.bin" || return 1
        cp "$RES/$name-$i.log" "$RES/$name-$i.txt"
    done
}

part_gdn_bench() {
    [ -d vendor/llama.cpp/ggml ] || gpu_vendor
    gdn_bench gdn-bench || return 1
    [ -n "${GPU_GDN_SRC:-}" ] || return 0
    gdn_bench gdn-bench-variant -I "$GPU_GDN_SRC" || return 1
    if cmp -s "$W/gdn-bench.bin" "$W/gdn-bench-variant.bin"; then
        log "gdn-bench: the variant's outputs equal the series' to the bit"
    else
        log "gdn-bench: the variant's outputs differ from the series'"
    fi
}

part_mmqs_bench() {
    mmqs_bench mmqs-bench "sm_$CUDA_ARCH"
}

part_mmqs_bench_86() {
    mmqs_bench mmqs-bench-86 compute_86
}

part_tbo_mmqs2() {
    gpu_tbo_build
    gpu_tbo mmqs2 "" test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(1|2|3|5|8|9|16|17|23|32|33|40|48|57|64),"
    gpu_tbo mmqs2-shared "" test -o MUL_MAT_SHARED_SRC1
    gpu_tbo perf-mmqs2 "" perf -o MUL_MAT -p "type_a=q[46]_K,type_b=f32,m=(17408|5120),n=(8|16|23|32|64),k=(5120|17408),"
}

# the cases patch 0029 adds for the series' other kernels (argmax and top-k of long rows, the
# concat of short rows) and MMQ at the series' 9-16 column tiles, with the small-batch kernel off
part_tbo_ops() {
    local op
    gpu_tbo_build
    for op in ARGMAX TOP_K CONCAT; do
        gpu_tbo "$op" "" test -o "$op"
    done
    gpu_tbo mmq-tiles GGML_CUDA_MMQ_SMALL=0 test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(9|13|16),"
}

TREE_OPS=(GATED_DELTA_NET_TREE SSM_CONV_TREE GATED_DELTA_NET SSM_CONV)

part_tree_ops() {
    local op
    gpu_tbo_build
    step tree-ssm 300 "$BIN/test-tree-ssm"
    tail -1 "$RES/tree-ssm.log" | tee -a "$RES/summary.txt"
    for op in "${TREE_OPS[@]}"; do
        gpu_tbo "$op" "" test -o "$op"
    done
    for op in GATED_DELTA_NET GATED_DELTA_NET_TREE; do
        gpu_tbo "perf-$op" "" perf -o "$op" -p "head_count=16,head_size=128"
    done
    for op in SSM_CONV SSM_CONV_TREE; do
        gpu_tbo "perf-$op" "" perf -o "$op" -p "10240"
    done
}

# its own build folder, only these two targets and no FA kernels for quantized KV; gpu_tbo runs
# this build's test-backend-ops (BIN is local here)
part_ampere() {
    local BIN=$R/vendor/build/cuda86/bin op
    step build86 1200 bash -c "cmake -S vendor/llama.cpp -B vendor/build/cuda86 $CUDA_FLAGS -DGGML_CUDA_FA_ALL_QUANTS=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=86-virtual -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        > /dev/null && cmake --build vendor/build/cuda86 -j 16 --target test-tree-ssm test-backend-ops" || return 1
    step tree-ssm-86 300 "$BIN/test-tree-ssm" -b CUDA0
    tail -1 "$RES/tree-ssm-86.log" | tee -a "$RES/summary.txt"
    for op in "${TREE_OPS[@]}"; do
        gpu_tbo "86-$op" "" test -o "$op"
    done
}

# GPU_HARNESS_K: a pytest -k selection of the two files, for a run short of device time
part_correctness() {
    if [ -n "${GPU_HARNESS_K:-}" ]; then
        step correctness 1200 bash scripts/gpu_correctness.sh "$BIN" "$RES" correctness-cuda \
            tests/test_correctness.py tests/test_slots.py -k "$GPU_HARNESS_K"
    else
        step correctness 1200 bash scripts/gpu_correctness.sh "$BIN" "$RES"
    fi
    tail -1 "$RES/correctness-cuda.txt" | tee -a "$RES/summary.txt"
}

part_tree_decode() {
    local tiny
    if [ ! -x "$BIN/test-tree-decode" ]; then  # a lean build has only the server's targets
        gpu_tests_build tree-decode-build test-tree-decode
    fi
    tiny=$(python3 -c "from pathlib import Path; from buun_tool.formats import recipes; from buun_tool.measure import synth
print(synth.write_pair(recipes.load(), Path('$W/tiny-f32'), scale='tiny', seed=0, target_type='f32', draft_type='f32')[0])")
    step tree-decode 300 "$BIN/test-tree-decode" -m "$tiny" -ngl 99
    tail -1 "$RES/tree-decode.log" | tee -a "$RES/summary.txt"
}

part_ar() {
    gpu_ar_bench
    grep "tg128" "$RES/llama-bench-ar.log" | tee -a "$RES/summary.txt"
}

# widths NAME [VAR=VALUE...]: llama-bench pp 16-64 in the environment given
widths() {
    local name=$1
    shift
    step "$name" 300 env "$@" "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -ub 64 -p 16,23,32,48,64 -n 0 -r 10
    grep " pp" "$RES/$name.log" | tee -a "$RES/summary.txt"
}

part_widths() {
    widths widths
}

part_widths_mmvq() {
    local v
    for v in 1 0; do
        step "widths-small$v" 300 env GGML_CUDA_MMQ_SMALL=$v "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -ub 64 \
            -p 1,2,4,8 -n 0 -r 10
        grep " pp" "$RES/widths-small$v.log" | tee -a "$RES/summary.txt"
    done
}

part_bench() {
    step bench 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --synthetic-al 1 --synthetic-al 7.67 \
        --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench"
}

# the upstream build copies the settings of build's (its stamp), so the two differ by the patches alone
part_upstream() {
    if [ ! -x vendor/build/upstream-cuda/bin/llama-server ]; then  # GPU_UPSTREAM=1 builds it beside build's
        step build-upstream 1500 $BUUN build --upstream --jobs 16 || return 1
    fi
    cp vendor/build/upstream-cuda/buun-build.json "$RES/buun-build-upstream.json"
    step bench-upstream 1200 $BUUN bench "${BENCH[@]}" --against upstream --report --synthetic-al 1 --synthetic-al 7.67 \
        --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-upstream"
}

part_dflash2() {
    local r=qwen3.8-27b-dflash2 d2=(--scale full --suite code --mode raw --prompts 2 --n-predict 512)
    step synth-dflash2 600 $BUUN synth $r --scale full --target-type q4_k_m --draft-type q4_k
    step synth-dflash2-q8 300 $BUUN synth $r --scale full --target-type q4_k_m --draft-type q8_0
    step bench-dflash2 1200 env LLAMA_SPEC_PROFILE=1 $BUUN bench $r "${d2[@]}" --against upstream --report \
        --synthetic-al 1 --synthetic-al 6 --out "$RES/bench-dflash2"
    step bench-dflash2-q8 600 $BUUN bench $r "${d2[@]}" --no-ar --synthetic-al 6 --out "$RES/bench-dflash2-q8" \
        --target "$BUUN_MODELS_DIR/synthetic/synth-$r-full-q4_k_m.gguf" \
        --drafter "$BUUN_MODELS_DIR/synthetic/synth-$r-full-dflash-q8_0.gguf"
    part_dflash2_harness
}

part_dflash2_harness() {
    step dflash2-harness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES" dflash2-cuda tests/test_dflash2.py \
        -k "not setup"
    tail -1 "$RES/dflash2-cuda.txt" | tee -a "$RES/summary.txt"
}

part_variants() {
    local variants
    IFS=';' read -ra variants <<< "$GPU_VARIANTS"
    if [ "${GPU_VARIANTS_NO_BENCH:-0}" = 1 ]; then
        gpu_variants --no-bench "${variants[@]}"
    else
        gpu_variants "${variants[@]}"
    fi
}

part_tree_sweep() {
    step tree-sweep 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --no-ar --tree-budget "${GPU_TREE_BUDGETS:-16,22,32}" \
        --prompts 2 --n-predict 512 --out "$RES/tree-sweep"
}

part_fit() {
    step fit-ar 200 $BUUN fit --ctx 6048 --draft-max 0 --measure --scale full --json
    step fit-dflash 200 $BUUN fit --ctx 6048 --measure --scale full --json
    step fit-dflash-cd0 200 $BUUN fit --ctx 6048 --ctx-draft 0 --measure --scale full --json
    step fit-3090 60 $BUUN fit --gpu-mem 24
}

part_fit_tree() {
    local b
    for b in 0 22; do
        step "fit-tree$b" 300 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 256 --tree-budget "$b" \
            --measure --scale full --json
    done
}

# the converter runs on this machine's own Python (torch, transformers): nothing can be installed here
part_setup() {
    step setup 900 env BUUN_TEST_NGL=99 BUUN_CONVERTER_PYTHON=python3 \
        python3 -m pytest -q -rA "tests/test_setup.py::test_setup_runs_then_skips_everything"
}

part_slots_bench() {
    step slots-bench 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --synthetic-al 7.67 \
        --concurrency "${GPU_CONCURRENCY:-4}" --prompts "${GPU_SLOTS_PROMPTS:-4}" --n-predict "${GPU_SLOTS_N:-512}" \
        --out "$RES/slots-bench"
}

part_fit_slots() {
    local n
    for n in 1 2 4; do
        step "fit-slots$n" 300 $BUUN fit --slots "$n" --ctx-per-slot 8192 --measure --scale full --json
    done
}

# Two cards (a machine of several): the target split by layers over cards 0 and 1, the drafter on
# card 1, which holds the last layers (what `buun serve --gpus 0,1` runs); then card 1 reached
# through an RPC worker on this host (ggml-rpc-server, what `buun worker` runs) with card 0 local:
# llama.cpp puts RPC devices first, so the local card holds the last layers and the drafter. Each:
# the correctness harness (its chain checks) and the bench at synthetic AL 7.67 with the step
# profile, against the bench part's one-card figures of the same run.
SPLIT_ARGS="-sm layer -dev CUDA0,CUDA1 -devd CUDA1"
RPC_PORT=50052
RPC_ARGS="--rpc 127.0.0.1:$RPC_PORT -devd CUDA0"
# the checks of state across devices: greedy = AR, rollback and tape replay against decoding from
# scratch, device features, slot save/restore, a request ending inside its draft (chains only)
HARNESS_K="(lossless_greedy or rollback_matches or tape_replay or device_features or survives_slot_save or ends_inside) \
and not tree and not backend_sampling"

two_cards() {
    [ "$N_CARDS" -ge 2 ] || { log "one card only: the $1 part needs two"; return 1; }
}

part_split() {
    two_cards split || return 1
    # the -ts `buun serve --gpus 0,1` passes at the bench's context (fit's plan for these cards)
    local ts
    ts=$($BUUN fit --gpus 0,1 --ctx 6048 --json | python3 -c "import json, sys; print(json.load(sys.stdin)['split']['ts'])")
    SPLIT_ARGS+=" -ts ${ts:-1,1}"
    log "split: $SPLIT_ARGS"
    step correctness-split 900 env CUDA_VISIBLE_DEVICES=0,1 BUUN_TEST_DEVICE_ARGS="$SPLIT_ARGS" \
        bash scripts/gpu_correctness.sh "$BIN" "$RES" correctness-split tests/test_correctness.py -k "$HARNESS_K"
    tail -1 "$RES/correctness-split.txt" | tee -a "$RES/summary.txt"
    step bench-split 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --gpus 0,1 \
        --synthetic-al 7.67 --prompts 2 --n-predict 512 --out "$RES/bench-split"
}

part_rpc() {
    two_cards rpc || return 1
    # the worker caches tensors it was sent (-c): the bench's second server loads from its disk
    CUDA_VISIBLE_DEVICES=1 setsid "$BIN/ggml-rpc-server" -p "$RPC_PORT" -c > "$RES/rpc-worker.log" 2>&1 &
    local worker=$!
    for _ in $(seq 30); do (exec 3<>/dev/tcp/127.0.0.1/$RPC_PORT) 2>/dev/null && break; sleep 1; done
    step correctness-rpc 900 env BUUN_TEST_DEVICE_ARGS="$RPC_ARGS" \
        bash scripts/gpu_correctness.sh "$BIN" "$RES" correctness-rpc tests/test_correctness.py -k "$HARNESS_K"
    tail -1 "$RES/correctness-rpc.txt" | tee -a "$RES/summary.txt"
    step bench-rpc 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --rpc "127.0.0.1:$RPC_PORT" \
        --synthetic-al 7.67 --prompts 2 --n-predict 512 --out "$RES/bench-rpc"
    kill "$worker"
}

part_fit_split() {
    local ctx
    two_cards fit-split || return 1
    step fit-split-plan 60 $BUUN fit --gpus 0,1
    for ctx in 6048 131072; do
        step "fit-gpu0-c$ctx" 300 $BUUN fit --gpus 0 --ctx "$ctx" --measure --scale full --json
        step "fit-split-c$ctx" 300 $BUUN fit --gpus 0,1 --ctx "$ctx" --measure --scale full --json
    done
}

part_tune() {
    local drafter work=(--suite code --mode raw,chat,chat-sampled --prompts 2 --n-predict 128)
    drafter=$(ls "$BUUN_MODELS_DIR"/synthetic/synth-*-full-dflash-q4_k.gguf)
    step tune 900 $BUUN tune --target "$TARGET" --drafter "$drafter" --tree-profile calibrated --budget-s 900 \
        --json --out "$RES/tune"
    step tune-sweep 900 $BUUN bench --scale full --untuned "${work[@]}" --tree-budget 15,22 --out "$RES/tune-sweep"
    step tune-sweep8 600 $BUUN bench --scale full --untuned "${work[@]}" --no-ar --tree-budget 0 --draft-max 8 \
        --out "$RES/tune-sweep8"
    step tune-vs-sweep 60 python3 scripts/tune_vs_sweep.py "$RES/tune" "$RES/tune-sweep/bench.json" \
        "$RES/tune-sweep8/bench.json"
    tail -1 "$RES/tune-vs-sweep.log" | tee -a "$RES/summary.txt"
    step tune-trees 900 $BUUN tune --target "$TARGET" --drafter "$drafter" --tree-profile "${GPU_TUNE_PROFILE:-0.2:0}" \
        --budget-s 900 --json --out "$RES/tune-trees"
    grep -h '"picked"' "$RES/tune/tune.json" "$RES/tune-trees/tune.json" | tee -a "$RES/summary.txt"
}

# `buun tune` of the DFlash2 recipe on its full-size synthetic pair (GPU_TUNE_BUDGET_S: its budget)
part_tune_dflash2() {
    local r=qwen3.8-27b-dflash2 d=$BUUN_MODELS_DIR/synthetic
    step synth-dflash2 600 $BUUN synth $r --scale full --target-type q4_k_m --draft-type q4_k
    step tune-dflash2 900 $BUUN tune $r --target "$d/synth-$r-full-q4_k_m.gguf" \
        --drafter "$d/synth-$r-full-dflash-q4_k.gguf" --budget-s "${GPU_TUNE_BUDGET_S:-300}" --json --out "$RES/tune-dflash2"
    tail -3 "$RES/tune-dflash2.log" | tee -a "$RES/summary.txt"
}

part_long() {
    step long 900 env LLAMA_SPEC_PROFILE=1 $BUUN bench --scale full --suite long --mode raw --synthetic-al 7.67 \
        --n-predict 256 --out "$RES/long"
    grep -h "prompt rows before" "$RES"/long/server-*.log | tail -4 | tee -a "$RES/summary.txt"
}

part_pack() {
    gpu_pack
}

# every part named is checked before the first runs: a typo found after a 25-minute build costs the run
for part in "$@"; do
    if ! declare -F "part_${part//-/_}" > /dev/null; then
        log "unknown part: $part"
        exit 2
    fi
    if [ "$part" = variants ] && [ -z "${GPU_VARIANTS:-}" ]; then
        log "the variants part needs GPU_VARIANTS (\"NAME|VAR=VALUE ...[|SERVER_ARGS];...\")"
        exit 2
    fi
done
for part in "$@"; do
    "part_${part//-/_}"
done
log "done in $SECONDS s"
