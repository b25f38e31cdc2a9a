#!/usr/bin/env bash
# Build every prefix of the patch series on the CPU, so that each patch can be taken (or bisected)
# one at a time: the pin plus patches 0001..N, for each N, llama-server and llama-speculative-simple
# (and the series' test programs once their patch is in). A prefix that touches only CUDA or
# Python files is skipped here (scripts/cuda_compile_check.py compiles the CUDA sources).
#
#     bash scripts/series_prefix_build.sh [FIRST [LAST]]      # after `buun vendor && buun patch`
#
# Works in a scratch worktree of vendor/llama.cpp and a build folder of its own under
# ${TMPDIR:-/tmp}; with ccache a prefix rebuilds only what it changed (the whole run took ~25 min on
# 2 cores, most of it the first prefix). Prints one line a prefix and exits non-zero if one fails.
set -u -o pipefail
cd "$(dirname "$0")/.."
first=${1:-1} last=${2:-9999}
work=$(mktemp -d "${TMPDIR:-/tmp}/buun-prefix-XXXXXX")
# the checkout's layout under $work, with ccache's base there: the objects of a prefix whose sources
# equal the product build's (make llama, CCACHE_BASEDIR the checkout) come from the cache
tree=$work/vendor/llama.cpp build=$work/vendor/build/cpu
export CCACHE_BASEDIR=$work GIT_COMMITTER_NAME=buun GIT_COMMITTER_EMAIL=buun@localhost
mkdir -p "$work/vendor"
git -C vendor/llama.cpp worktree add -q --detach "$tree" buun-baseline || exit 1
trap 'git -C vendor/llama.cpp worktree remove --force "$tree"; rm -rf "$work"' EXIT
amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # as `buun build --cpu` (buun_tool/pipeline/build.py)
cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "-DCMAKE_C_FLAGS=$amx" "-DCMAKE_CXX_FLAGS=$amx" > "$work/cmake.log" 2>&1 \
    || { echo "cmake failed: $work/cmake.log"; exit 1; }
failed=0 n=0
for patch in patches/[0-9][0-9][0-9][0-9]-*.patch; do
    n=$((n + 1))
    git -C "$tree" am -q --committer-date-is-author-date "$PWD/$patch" || { echo "$patch does not apply"; exit 1; }
    [ "$n" -ge "$first" ] && [ "$n" -le "$last" ] || continue
    if ! git -C "$tree" diff --name-only HEAD~1 HEAD | grep -qv '^ggml/src/ggml-cuda/\|^conversion/'; then
        echo "$(basename "$patch"): skipped (CUDA or Python only)"
        continue
    fi
    targets="llama-server llama-speculative-simple"
    for t in test-tree-ssm test-tree-decode test-ddtree; do
        grep -q "$t" "$tree/tests/CMakeLists.txt" && targets="$targets $t"
    done
    start=$SECONDS
    if cmake --build "$build" -j "$(nproc)" --target $targets > "$work/build.log" 2>&1; then
        echo "$(basename "$patch"): builds ($((SECONDS - start)) s)"
    else
        failed=1
        echo "$(basename "$patch"): FAILS"
        grep -m5 "error" "$work/build.log"
    fi
done
exit $failed
