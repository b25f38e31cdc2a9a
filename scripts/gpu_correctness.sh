#!/usr/bin/env bash
# The correctness harness (tests/test_correctness.py, and tests/test_slots.py: several slots) against a
# CUDA build, on a GPU machine.
#   scripts/gpu_correctness.sh [BIN_DIR] [OUT_DIR] [NAME] [PYTEST_ARGS...]
# BIN_DIR defaults to the CUDA build of this checkout (vendor/build/cuda/bin); results (junit XML
# and the pytest log, OUT_DIR/NAME.{txt,xml}, NAME correctness-cuda by default) go to OUT_DIR
# (default: docs/results), to be committed under docs/. PYTEST_ARGS replace the two files (a -k
# selection, say). BUUN_TEST_DEVICE_ARGS, where set, places the models
# (tests/support/real_llama_server.py: a split over two cards, an RPC worker).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-vendor/build/cuda/bin}
out=${2:-docs/results}
name=${3:-correctness-cuda}
shift $(( $# < 3 ? $# : 3 ))
[ $# -gt 0 ] || set -- tests/test_correctness.py tests/test_slots.py
mkdir -p "$out"
export BUUN_LLAMA_BIN_DIR=$(realpath "$bin") BUUN_TEST_NGL=99
{
  echo "# correctness harness, $(date -u +%FT%TZ)"
  echo "# CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} BUUN_TEST_DEVICE_ARGS=${BUUN_TEST_DEVICE_ARGS:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$bin/llama-server" --version 2>&1 | tail -2
} > "$out/$name.txt"
python3 -m pytest -p no:cacheprovider -q -rA "$@" --junitxml="$out/$name.xml" 2>&1 | tee -a "$out/$name.txt"
exit "${PIPESTATUS[0]}"
