#!/usr/bin/env bash
# The correctness harness (tests/test_correctness.py, and tests/test_slots.py: several slots) against a
# CUDA build, on a GPU machine.
#   scripts/gpu_correctness.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR defaults to the CUDA build of this checkout (vendor/build/cuda/bin); results (junit XML
# and the pytest log) go to OUT_DIR (default: docs/results), to be committed under docs/.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-vendor/build/cuda/bin}
out=${2:-docs/results}
mkdir -p "$out"
export BUUN_LLAMA_BIN_DIR=$(realpath "$bin") BUUN_TEST_NGL=99
{
  echo "# correctness harness, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$bin/llama-server" --version 2>&1 | tail -2
} > "$out/correctness-cuda.txt"
python3 -m pytest -p no:cacheprovider -q -rA tests/test_correctness.py tests/test_slots.py --junitxml="$out/correctness-cuda.xml" 2>&1 \
  | tee -a "$out/correctness-cuda.txt"
exit "${PIPESTATUS[0]}"
