# Shared by the GPU driver (scripts/gpu_run.sh, its named parts): run on a lent
# H100/H200 machine (CUDA, no internet) from a copy of the checkout. Source it, then call
# gpu_prepare. Needs .carry/llama-src.tar.xz (`buun vendor --archive .carry/llama-src.tar.xz`) and
# .whl/ (buun's dependencies as Python 3.12 wheels, see docs/benchmarks.md) in the working tree.
set -u -o pipefail
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W=${W:-/tmp/buun-gpu}
RES=$W/results
mkdir -p "$RES" "$W"
cd "$R"

log() { echo "[$(date +%T)] $*" | tee -a "$RES/summary.txt"; }
step() {  # step NAME LIMIT_S CMD...: its output in $RES/NAME.log, its exit code in summary.txt
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    log "start $name"
    timeout --kill-after=20 "$limit" "$@" > "$RES/$name.log" 2>&1
    rc=$?
    log "end $name: rc=$rc in $((SECONDS - t0)) s"
    return $rc
}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$RES/pip.log" 2>&1 || { log "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$R PYTHONUNBUFFERED=1
export BUUN_MODELS_DIR=$W/models BUUN_DATA_DIR=$W/data BUUN_STATE_DIR=$W/state BUUN_CACHE_DIR=$W/cache
BUUN="python3 -m buun_tool"
BIN=$R/vendor/build/cuda/bin
# a lean build (gpu_prepare_lean) has no stamp of `buun build`: a later call of the driver on the same
# machine finds its binaries by their folder
[ -f vendor/build/cuda/buun-build.json ] || [ ! -x "$BIN/llama-server" ] || export BUUN_LLAMA_BIN_DIR=$BIN
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)  # Nsight Compute, for kernel timings

# the machine's CUDA arch as the build module detects it (what `buun build --cuda` picks: "90" on an
# H100/H200), so no script names one; GPU_CUDA_ARCH=86-virtual builds Ampere's code as PTX only, which
# the driver compiles for this card at load (the parts that build llama.cpp; not the kernel benches)
CUDA_ARCH=${GPU_CUDA_ARCH:-$(python3 -c "from buun_tool.base import nvidia; print(';'.join(sorted({g.arch for g in nvidia.detect_gpus()})))")}
[ -n "$CUDA_ARCH" ] || { log "no GPU visible to nvidia-smi: no CUDA arch"; exit 1; }
# On a machine of several cards every part runs on card 0 unless it names its cards (split, rpc):
# the one-card figures of a multi-card run are then one card's, as on a one-card machine.
export CUDA_VISIBLE_DEVICES=${GPU_CARD:-0}
N_CARDS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")

# the product's CUDA flags (what `buun build --cuda` configures) less the arch, and with it, for the
# parts that build only a few targets, in a bash -c command line (the arch quoted: a list of
# several is "86;90"): bash -c "cmake -S vendor/llama.cpp -B DIR $CUDA_CMAKE ..."
CUDA_FLAGS="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=ON -DGGML_CUDA_FA=ON"
CUDA_FLAGS+=" -DGGML_CUDA_FA_ALL_QUANTS=ON"
CUDA_CMAKE="$CUDA_FLAGS -DCMAKE_CUDA_ARCHITECTURES='$CUDA_ARCH'"

# the machine's facts, then the pinned tree from the carried archive with the series applied;
# exits on failure
# GPU_EXTRA_DIFF: a diff applied to the patched tree, uncommitted (a diagnostic kept out of the
# series, such as scripts/diagnostics/*.diff); buun-build.json records it as uncommitted
gpu_vendor() {
    { nvidia-smi; nproc; free -g; python3 --version; nvcc --version | tail -1; echo "CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"; } \
        > "$RES/machine.txt" 2>&1
    step vendor 120 bash -c "$BUUN vendor --from-archive .carry/llama-src.tar.xz && $BUUN patch" || exit 1
    if [ -n "${GPU_EXTRA_DIFF:-}" ]; then
        step extra-diff 30 git -C vendor/llama.cpp apply "$(realpath "$GPU_EXTRA_DIFF")" || exit 1
    fi
}

# vendor + patch, then a build (gpu_build_synth LIMIT_S CMD...) while the full-size synthetic pair
# is written; exits on failure (the build's own log, where it keeps one, goes to $RES)
gpu_build_synth() {
    local limit=$1
    shift
    gpu_vendor
    step build "$limit" "$@" &
    local build_pid=$! up_pid=
    if [ "${GPU_UPSTREAM:-0}" = 1 ]; then  # the unpatched pin's build beside it (the upstream part's), same flags
        step build-upstream 1500 $BUUN build --upstream --cuda --cuda-arch "$CUDA_ARCH" --jobs 16 &
        up_pid=$!
    fi
    step synth 600 $BUUN synth --scale full --target-type q4_k_m --draft-type q4_k
    wait $build_pid || { log "build failed"; cp vendor/build/cuda/build.log "$RES/build-full.log" 2>/dev/null; exit 1; }
    [ -z "$up_pid" ] || wait $up_pid || log "the upstream build failed: the upstream part builds again"
    TARGET=$(ls "$BUUN_MODELS_DIR"/synthetic/synth-*-full-q4_k_m.gguf)
}

# the CUDA build with the product flags, for the machine's own GPU (the build detects the arch)
gpu_prepare() {
    gpu_build_synth 1500 $BUUN build --cuda --jobs 16
    cp vendor/build/cuda/buun-build.json "$RES/"
}

# gpu_prepare for a session with little device time left: llama-server, llama-bench and
# llama-speculative-simple (the harness runs it) only (and the targets named: gpu_prepare_lean
# [TARGET...]), and without GGML_CUDA_FA_ALL_QUANTS (its kernels serve quantized KV caches; the
# benches' is f16, so they run the same kernels); buun's stages find them through BUUN_LLAMA_BIN_DIR
gpu_prepare_lean() {
    gpu_build_synth 900 bash -c "cmake -S vendor/llama.cpp -B vendor/build/cuda $CUDA_CMAKE -DGGML_CUDA_FA_ALL_QUANTS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > /dev/null \
        && cmake --build vendor/build/cuda -j 16 --target llama-server llama-bench llama-speculative-simple $*"
    export BUUN_LLAMA_BIN_DIR=$BIN
}

BENCH=(--scale full --suite code --mode raw)  # `buun bench` on the synthetic pair, the code prompts

# gpu_tests_build NAME TARGET...: test targets added to the CUDA build of gpu_prepare or
# gpu_prepare_lean (only the tests' objects compile)
gpu_tests_build() {
    local name=$1
    shift
    step "$name" 900 bash -c "cmake -S vendor/llama.cpp -B vendor/build/cuda -DLLAMA_BUILD_TESTS=ON > /dev/null \
        && cmake --build vendor/build/cuda -j 16 --target $*"
}

gpu_tbo_build() {
    gpu_tests_build tbo-build test-backend-ops test-tree-ssm
}

# a test-backend-ops run on the CUDA device in the environment given, its verdict (test) or its
# timings (perf) in summary.txt: gpu_tbo NAME "VAR=VALUE ..." test|perf ARGS...; $RES/tbo-NAME.log
gpu_tbo() {
    local name=$1 vars=$2 mode=$3
    shift 3
    step "tbo-$name" 300 env $vars "$BIN/test-backend-ops" "$mode" -b CUDA0 "$@"
    if [ "$mode" = test ]; then tail -2 "$RES/tbo-$name.log"; else grep "us/run" "$RES/tbo-$name.log"; fi \
        | tee -a "$RES/summary.txt"
}

# test-backend-ops eval of one op and perf of the cases PERF_FILTER picks, for each variant (a
# switch's settings, such as GGML_CUDA_MMQ_SMALL unset and 0):
# gpu_tbo_variants OP PERF_FILTER "NAME|VAR=VALUE ..." ...; $RES/tbo-[perf-]NAME.log
gpu_tbo_variants() {
    local op=$1 filter=$2 v name vars
    shift 2
    for v in "$@"; do
        IFS='|' read -r name vars <<< "$v"
        gpu_tbo "$name" "$vars" test -o "$op"
        gpu_tbo "perf-$name" "$vars" perf -o "$op" -p "$filter"
    done
}

# llama-bench pp16 (40 repetitions) and the ncu window of a 16-token batch, in the environment
# given: gpu_pp16 NAME [VAR=VALUE...]; the pp16 line and the window's top kernels in summary.txt
gpu_pp16() {
    local name=$1
    shift
    step "llama-bench-$name" 300 env "$@" "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 16 -n 0 -r 40
    grep "pp16" "$RES/llama-bench-$name.log" | tee -a "$RES/summary.txt"
    ( [ $# -gt 0 ] && export "$@"; gpu_ncu_window "pp16-$name" -p 16 -n 0 -r 2 )
    head -8 "$RES/ncu-pp16-$name.txt" >> "$RES/summary.txt"
}

# the per-phase profile of a DFlash step (LLAMA_SPEC_PROFILE=1) at synthetic AL 1 and
# 8.31: gpu_profile NAME [VAR=VALUE...] [-- BENCH_ARGS...]; its profile lines in $RES/profile-NAME.txt
gpu_profile() {
    local name=$1 vars=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    step "profile-$name" 600 env LLAMA_SPEC_PROFILE=1 "${vars[@]}" $BUUN bench "${BENCH[@]}" --no-ar \
        --synthetic-al 1 --synthetic-al 8.31 --prompts 1 --n-predict 512 "$@" --out "$RES/profile-$name"
    grep -H "spec profile" "$RES/profile-$name"/server-*.log > "$RES/profile-$name.txt"
}

# `buun bench` (AR and synthetic AL 1 / 7.67 / 8.31, 2 prompts x 512 tokens) of each variant, with
# extra llama-server flags where given: gpu_benches "NAME|VAR=VALUE ...[|SERVER_ARGS]" ...; results
# in $RES/bench-NAME
gpu_benches() {
    local v name vars extra
    for v in "$@"; do
        IFS='|' read -r name vars extra <<< "$v"
        step "bench-$name" 600 env $vars $BUUN bench "${BENCH[@]}" --server-args "$extra" \
            --synthetic-al 1 --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench-$name"
    done
}

# each server's last step-profile line of gpu_benches' bench NAME (run with LLAMA_SPEC_PROFILE=1),
# appended to profile.txt: gpu_profile_lines NAME
gpu_profile_lines() {
    local f
    for f in "$RES/bench-$1"/server-*.log; do
        grep "spec profile" "$f" | tail -1 | sed "s|^.*spec profile: |bench-$1/$(basename "$f"): |" >> "$RES/profile.txt"
    done
}

# gpu_benches' bench of one configuration with the step profile, in the environment given:
# gpu_bench_line NAME [VAR=VALUE...]; results in $RES/bench-NAME, a line of each configuration's
# tok/s and AL in summary.txt, each server's last profile line in profile.txt
gpu_bench_line() {
    local name=$1
    shift
    gpu_benches "$name|LLAMA_SPEC_PROFILE=1 $*|"
    gpu_profile_lines "$name"
    python3 - "$RES/bench-$name/bench.json" "$name" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], "|", "; ".join(f"{r['config']}: {r['decode_tps']:.1f} tok/s AL {r.get('mean_al') or 0:.2f}"
                                  for r in d["summary"]))
PY
}

# the per-phase profile and `buun bench` of each variant (only the profile with --no-bench), the
# variants interleaved, twice: gpu_variants [--no-bench] "NAME|VAR=VALUE ...[|SERVER_ARGS]" ...;
# results in $RES/profile-NAME-1, bench-NAME-1, ...
gpu_variants() {
    local rep v name vars extra bench=1
    if [ "$1" = --no-bench ]; then
        bench=0
        shift
    fi
    for rep in 1 2; do
        for v in "$@"; do
            IFS='|' read -r name vars extra <<< "$v"
            gpu_profile "$name-$rep" $vars -- --server-args "$extra"
            if [ $bench = 1 ]; then
                gpu_benches "$name-$rep|$vars|$extra"
            fi
        done
    done
}

# the AR anchor of a run: llama-bench's tg128 of the target ($RES/llama-bench-ar.log)
gpu_ar_bench() {
    step llama-bench-ar 300 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 1 -n 128 -r 5
}

# per-kernel GPU times (ncu, warm caches, unlocked clocks) over a window of 1400 kernels of
# llama-bench, summed per kernel: gpu_ncu_window NAME LLAMA_BENCH_ARGS...; $RES/ncu-NAME.txt
gpu_ncu_window() {
    local name=$1
    shift
    step "ncu-$name" 300 "$NCU" --cache-control none --clock-control none --launch-skip 3000 --launch-count 1400 \
        --metrics gpu__time_duration.sum --csv "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 "$@"
    python3 scripts/ncu_sum.py "$RES/ncu-$name.log" > "$RES/ncu-$name.txt"
}

# the full ncu report (stall reasons, occupancy) of two launches of the 16-column MMQ kernel in a
# 16-token batch (the FFN's Q4_K and Q6_K matmuls): gpu_ncu_mmq NAME; $RES/ncu-NAME.log
gpu_ncu_mmq() {
    step "ncu-$1" 300 "$NCU" --set full --cache-control none --clock-control none -k "regex:^mul_mat_q$" \
        --launch-skip 200 --launch-count 2 "$BIN/llama-bench" -m "$TARGET" -ngl 99 -fa 1 -p 16 -n 0 -r 1
}

# what comes back: one archive, $W/results.tgz (the device tool returns a few files per call)
gpu_pack() {
    mkdir -p "$W/pack"
    cp -r "$RES"/*.txt "$RES"/*.log "$RES"/*.json "$RES"/*.xml "$W/pack/" 2>/dev/null
    for d in "$RES"/*/; do
        d=${d%/}
        [ -d "$d" ] || continue
        mkdir -p "$W/pack/$(basename "$d")"
        cp "$d"/*.json "$d"/*.png "$d"/*.html "$W/pack/$(basename "$d")/" 2>/dev/null
        for f in "$d"/server-*.log; do
            grep -E "buffer size|rollback =|spec profile|graphs reused|eval time|draft acceptance|cuda graph debug" "$f" \
                > "$W/pack/$(basename "$d")/$(basename "$f")"
        done
    done
    tar czf "$W/results.tgz" -C "$W" pack
}

# the processes under PID (its children, theirs, ...), one id a line
gpu_descendants() {
    local c
    for c in $(ps -o pid= --ppid "$1"); do
        echo "$c"
        gpu_descendants "$c"
    done
}

# per-kernel GPU times (ncu) of a few speculative steps of a DFlash server, started with the argv
# that `buun bench` logged at the top of SERVER_LOG and given one greedy request:
# gpu_ncu_server NAME SERVER_LOG; $RES/ncu-NAME.txt splits the window by CUDA stream (ncu_steps.py).
# Only the server this function started is stopped: the descendant of its ncu that runs the argv's
# binary, by its process id, so that ncu then writes its report and exits.
gpu_ncu_server() {
    local name=$1 argv port pid server p rc
    argv=$(head -1 "$2" | sed 's/^\$ //')
    port=$(sed -n 's/.*--port \([0-9]*\).*/\1/p' <<< "$argv")
    server=$(realpath "$(eval "printf '%s\n' $argv" | head -1)")
    log "start ncu-$name"
    eval "timeout 400 $NCU --cache-control none --clock-control none --launch-skip 60000 --launch-count 6000 \
        --metrics gpu__time_duration.sum --csv $argv" > "$RES/ncu-$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    curl -s "http://127.0.0.1:$port/completion" -d '{"prompt": "def quicksort(items):", "n_predict": 160,
        "temperature": 0, "ignore_eos": true, "cache_prompt": false}' > "$RES/ncu-$name-reply.json"
    for p in $(gpu_descendants "$pid"); do
        [ "$(readlink -f "/proc/$p/exe" 2> /dev/null)" = "$server" ] && kill -TERM "$p"
    done
    wait $pid
    rc=$?
    log "end ncu-$name: rc=$rc"
    python3 scripts/ncu_steps.py "$RES/ncu-$name.log" > "$RES/ncu-$name.txt"
    head -12 "$RES/ncu-$name.txt" >> "$RES/summary.txt"
}

# `buun bench --concurrency N --no-ar` at synthetic AL 7.67 (one slot, then N requests at once) with
# the step profile, in the environment given: a line of summary.txt (each config's tok/s and AL, each
# group's), the servers' profiles in profile.txt.
# gpu_slots NAME SLOTS PROMPTS TOKENS [VAR=VALUE...] -- [BENCH ARGS...]; $RES/NAME/
gpu_slots() {
    local name=$1 n=$2 prompts=$3 tokens=$4 vars=()
    shift 4
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    step "$name" 600 env LLAMA_SPEC_PROFILE=1 "${vars[@]}" $BUUN bench "${BENCH[@]}" --no-ar --synthetic-al 7.67 \
        --concurrency "$n" --prompts "$prompts" --n-predict "$tokens" --out "$RES/$name" "$@"
    python3 - "$RES/$name/bench.json" "$name" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [f"{r['config']}: {r.get('aggregate_tps') or r['decode_tps']:.1f} tok/s (served {r.get('served_tps') or 0:.1f})"
        f" AL {r.get('mean_al') or 0:.2f}" for r in d["summary"]]
groups = [f"{g['config']}#{g['index']}: {g['decode_tokens'] / g['window_ms'] * 1000:.1f}" for g in d["groups"]]
print(sys.argv[2], "|", "; ".join(rows), "| groups:", ", ".join(groups))
PY
    for f in "$RES/$name"/server-*.log; do
        grep "spec profile" "$f" | sed "s|^.*spec profile: |$name/$(basename "$f"): |" >> "$RES/profile.txt"
    done
}
