#!/usr/bin/env bash
# session 34: a step's verify within a maximum of rows over the slots (patch 0031, issue #49):
# forwards of 1-64 tokens of the target, then four slots at synthetic AL 7.67 with no maximum and
# at 32, 36, 44 and 52 rows (7, 8, 10 and 12 draft tokens a slot), three rounds (each bench: one
# slot, then four requests at once), and eight slots with no maximum and at 64 rows (three rounds),
# 48 and 32 (~16 min on 16 cores; summary.txt has each bench's tok/s and AL).
# The recorded run gave the build the maximum as a total of draft tokens, the flag's first form
# (--spec-draft-n-total T: T / slots tokens a slot), and its step names say T: s4-tT-rK, s8-tT-rK.
# Here the same shares are asked in rows (T + slots): s4-t28 is --spec-verify-max 32, s8-t56 is 64.
# `run.sh warm` is ../h200-2026-11-30-warm's run: four and eight slots at the recipe's 64 rows, two
# groups a server, with CUDA's lazy and eager module loading (~10 min).
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
bash scripts/gpu_run.sh build-lean || exit 1
. scripts/gpu_lib.sh
export BUUN_LLAMA_BIN_DIR=$BIN
if [ "${1:-}" = warm ]; then
    for n in 8 4; do
        for loading in LAZY EAGER; do
            gpu_slots "s$n-${loading,,}" $n $n $((2048 / n)) CUDA_MODULE_LOADING=$loading -- --repeats 2
        done
    done
else
    TARGET=$(ls "$BUUN_MODELS_DIR"/synthetic/synth-*-full-q4_k_m.gguf)
    step widths 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -ub 64 -p 1,8,16,24,32,40,48,56,64 -n 0 -r 10
    grep " pp" "$RES/widths.log" >> "$RES/summary.txt"
    for k in 1 2 3; do
        for rows in 0 32 36 44 52; do gpu_slots "s4-r$rows-$k" 4 4 512 -- --server-args "--spec-verify-max $rows"; done
    done
    for k in 1 2 3; do
        for rows in 0 64; do gpu_slots "s8-r$rows-$k" 8 8 256 -- --server-args "--spec-verify-max $rows"; done
    done
    for rows in 48 32; do gpu_slots "s8-r$rows-1" 8 8 256 -- --server-args "--spec-verify-max $rows"; done
fi
bash scripts/gpu_run.sh pack
echo "ALLDONE" >> "$RES/summary.txt"
