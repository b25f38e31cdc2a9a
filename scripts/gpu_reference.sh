#!/usr/bin/env bash
# gpu_reference.sh - the reference GPU run of `buun synth`, `buun bench` and `buun fit --measure`.
#
# Called from the repo checkout on a 16-core H100/H200 machine with CUDA and no internet:
#
#     OUT=/path/to/results bash scripts/gpu_reference.sh
#
# Needs, in the working tree:
#   .carry/llama-src.tar.xz   the trimmed llama.cpp source (`buun vendor --archive .carry/llama-src.tar.xz`)
#   .carry/wheels/            only if the machine's python3 lacks a dependency: wheels for typer rich gguf
#                             numpy psutil pyyaml requests huggingface_hub, made on a machine with PyPI by
#                             pip download -d .carry/wheels --only-binary=:all: --platform manylinux2014_x86_64 \
#                                 --python-version 3.X typer rich gguf numpy psutil pyyaml requests huggingface_hub
#                             (3.X = the GPU machine's python3 version)
#
# What it does (~7-8 min; every step has its own time limit so results come back even when one fails):
#   1. builds llama-server and llama-bench for CUDA sm_90 into $W/build/cuda, with a buun build stamp,
#      while `buun synth --scale full` writes the 16.5 GB + 1 GB synthetic pair;
#   2. llama-bench of the synthetic target (AR pp512 / tg128);
#   3. `buun bench`: AR and DFlash with --synthetic-al 1, 7.67 and 8.31 over the code, math and prose
#      suites, raw and chat, 512 tokens per request (JSON, PNG, server logs);
#   4. `buun fit --measure` for AR and for DFlash at -c 6048 -np 1 n_max 15 (the calibration point).
# Everything lands in $OUT; summary.txt lists each step's exit code and duration.
set -u -o pipefail

: "${OUT:?set OUT to the results folder}"
R=$(cd "$(dirname "$0")/.." && pwd)
W=${W:-/tmp/buun-gpu-ref}
export R W OUT
mkdir -p "$OUT" "$W"
export PYTHONPATH="$R${PYTHONPATH:+:$PYTHONPATH}"
export BUUN_BUILD_DIR="$W/build" BUUN_MODELS_DIR="$W/models" BUUN_DATA_DIR="$W/data"
export BUUN_STATE_DIR="$OUT/state" BUUN_CACHE_DIR="$W/cache" BUUN_CONFIG_DIR="$W/config"
BUUN="python3 -m buun_tool"
BIN="$BUUN_BUILD_DIR/cuda/bin"

log() { echo "[$(date +%T)] $*" | tee -a "$OUT/summary.txt"; }

# step NAME LIMIT_S CMD...: run with a time limit, output to $OUT/NAME.log, record the exit code.
step() {
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    log "start $name: $*"
    timeout --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    log "end $name: rc=$rc in $((SECONDS - t0)) s"
    return $rc
}

python_deps() {
    local mods="typer, rich, gguf, numpy, psutil, yaml, requests, huggingface_hub"
    python3 -c "import $mods" 2>/dev/null && return 0
    [ -d "$R/.carry/wheels" ] || { log "python3 lacks one of: $mods, and .carry/wheels is missing"; return 1; }
    python3 -m pip install -q --no-index --find-links "$R/.carry/wheels" \
        typer rich gguf numpy psutil pyyaml requests huggingface_hub && python3 -c "import $mods"
}

build_llama() {
    local src="$W/src" dst="$BUUN_BUILD_DIR/cuda"
    rm -rf "$src" && mkdir -p "$src" "$dst" || return 1
    tar -xJf "$R/.carry/llama-src.tar.xz" -C "$src" || return 1
    local tree; tree=$(find "$src" -maxdepth 2 -name CMakeLists.txt -printf '%h\n' | sort | head -1)
    local args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=ON -DGGML_CUDA_FA=ON
                -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
                -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
    command -v ninja >/dev/null || args=("${args[@]:2}")
    cmake -S "$tree" -B "$dst" "${args[@]}" && cmake --build "$dst" -j "$(nproc)" --target llama-server llama-bench \
        || return 1
    # the stamp buun's results record (build.read_stamp); this build is not `buun build`'s, so say how it was made
    python3 - "$dst" "$R/.carry/llama-src.tar.xz" "${args[*]}" <<'PY'
import hashlib, json, subprocess, sys
from buun_tool import vendor
dst, archive, args = sys.argv[1], sys.argv[2], sys.argv[3]
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
stamp = {"pin": vendor.load_pin().commit, "made_by": "scripts/gpu_reference.sh",
         "source": {"archive_sha256": hashlib.sha256(open(archive, "rb").read()).hexdigest()},
         "variant": "cuda", "arch": "90", "cmake_args": args.split(), "nvcc": nvcc[-1] if nvcc else None,
         "targets": ["llama-server", "llama-bench"]}
open(f"{dst}/buun-build.json", "w").write(json.dumps(stamp, indent=2) + "\n")
PY
}

export -f log python_deps build_llama  # `timeout` runs them through bash -c

log "gpu_reference.sh in $R, work dir $W, results in $OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
step python-deps 300 bash -c python_deps || { log "python dependencies missing: stopping"; exit 1; }

step build 480 bash -c build_llama &
build_pid=$!
step synth 300 $BUUN synth --scale full --target-type q4_k_m --draft-type q4_k
wait $build_pid || { log "build failed: see $OUT/build.log"; exit 1; }

T=$(ls "$BUUN_MODELS_DIR"/synthetic/synth-*-full-q4_k_m.gguf)
step llama-bench 150 "$BIN/llama-bench" -m "$T" -ngl 99 -fa 1 -p 512 -n 128 -r 2

step bench 330 $BUUN bench --scale full --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 \
    --suite code,math,prose --mode raw,chat --prompts 1 --n-predict 512 --out "$OUT/bench"

step fit-ar 120 $BUUN fit --ctx 6048 --draft-max 0 --batch 2048 --ubatch 512 --measure --scale full
step fit-dflash 150 $BUUN fit --ctx 6048 --draft-max 15 --ctx-draft 0 --measure --scale full
step fit-3090 60 $BUUN fit --gpu-mem 24

log "done in $SECONDS s"
