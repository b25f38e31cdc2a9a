#!/usr/bin/env bash
# The GPU driver: the named parts, in order, on a lent H100/H200 machine, from a copy of the
# checkout (CUDA, no internet; .carry/ and .whl/ as gpu_lib.sh says):
#
#     bash scripts/gpu_run.sh PART...
#
# A run outlasts one 10-minute device command: start it detached and poll (docs/benchmarks.md).
# Each step's log is in $RES (/tmp/buun-gpu/results), its exit code and time in summary.txt.
#   build        vendor + patch, the product CUDA build for the machine's own GPU (`buun build
#                --cuda`: the arch comes from nvidia-smi) while the full-size synthetic pair is written
#   tbo-mmqs     test-backend-ops: the small-batch K-quant kernel's MUL_MAT cases (9-32 columns)
#                against the CPU, and its timings at the 27B's FFN shapes, 16 against 17-32
#                columns, with 0031's two variants (GGML_CUDA_MMQS_INTERLEAVE=0/1)
#   correctness  the correctness harness on CUDA (tests/test_correctness.py, tie-aware rule)
#   tree-decode  test-tree-decode on the tiny pair in f32, offloaded (patches 0027-0029)
#   ar           llama-bench tg128 of the target: the run's AR anchor
#   bench        `buun bench`: AR, and DFlash chains at synthetic AL 1 / 7.67 / 8.31, with the
#                per-phase step profile (LLAMA_SPEC_PROFILE=1)
#   tree-sweep   `buun bench --tree-budget 16,22,32` (the chain added) under the calibrated tree
#                profile, with the step profile
#   tree-sweep-il  the same with GGML_CUDA_MMQS_INTERLEAVE=1 (0031's variant)
#   fit-tree     `buun fit --measure` of the chain and of a budget-22 tree
#   pack         $W/results.tgz: what the docs keep of the run
. "$(dirname "$0")/gpu_lib.sh"

part_build() {
    gpu_build_synth 1500 $BUUN build --cuda --jobs 16
    cp vendor/build/cuda/buun-build.json "$RES/"
}

part_tbo_mmqs() {
    gpu_tbo_build
    gpu_tbo mmqs "" test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(9|16|17|23|32),"
    local v
    for v in 0 1; do
        gpu_tbo "mmqs-il$v" "GGML_CUDA_MMQS_INTERLEAVE=$v" test -o MUL_MAT -p "type_a=q[456]_K,type_b=f32,m=[0-9]+,n=(17|23|32),"
        gpu_tbo "perf-mmqs-il$v" "GGML_CUDA_MMQS_INTERLEAVE=$v" perf -o MUL_MAT \
            -p "type_a=q[46]_K,type_b=f32,m=(17408|5120),n=(16|17|23|32),k=(5120|17408),"
    done
}

part_correctness() {
    step correctness 900 bash scripts/gpu_correctness.sh "$BIN" "$RES"
}

part_tree_decode() {
    local tiny
    tiny=$(python3 -c "from pathlib import Path; from buun_tool import recipes, synth
print(synth.write_pair(recipes.load(), Path('$W/tiny-f32'), scale='tiny', seed=0, target_type='f32', draft_type='f32')[0])")
    step tree-decode 300 "$BIN/test-tree-decode" -m "$tiny" -ngl 99
    tail -1 "$RES/tree-decode.log" | tee -a "$RES/summary.txt"
}

part_ar() {
    gpu_ar_bench
    grep "tg128" "$RES/llama-bench-ar.log" | tee -a "$RES/summary.txt"
}

part_bench() {
    step bench 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --synthetic-al 1 --synthetic-al 7.67 \
        --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench"
}

part_tree_sweep() {
    step tree-sweep 600 env LLAMA_SPEC_PROFILE=1 $BUUN bench "${BENCH[@]}" --no-ar --tree-budget 16,22,32 \
        --prompts 2 --n-predict 512 --out "$RES/tree-sweep"
}

# the sweep with the small-batch kernel's two column groups interleaved (0031's other variant)
part_tree_sweep_il() {
    step tree-sweep-il 600 env LLAMA_SPEC_PROFILE=1 GGML_CUDA_MMQS_INTERLEAVE=1 $BUUN bench "${BENCH[@]}" --no-ar \
        --tree-budget 16,22,32 --prompts 2 --n-predict 512 --out "$RES/tree-sweep-il"
}

part_fit_tree() {
    local b
    for b in 0 22; do
        step "fit-tree$b" 300 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 256 --tree-budget "$b" \
            --measure --scale full --json
    done
}

part_pack() {
    gpu_pack
}

for part in "$@"; do
    fn="part_${part//-/_}"
    if ! declare -F "$fn" > /dev/null; then
        log "unknown part: $part"
        exit 2
    fi
    "$fn"
done
log "done in $SECONDS s"
