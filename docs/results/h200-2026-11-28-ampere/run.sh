#!/usr/bin/env bash
# session 26: the series (0001-0048) built for Ampere's compute_86 as PTX only (the driver compiles
# it for the H200 at load): the CUDA harness, test-tree-decode, the tree ops and the small-batch
# kernel's MUL_MAT cases against the CPU, all on the code a 3090 would get
set -u
cd "$(dirname "$0")/.."
export GPU_CUDA_ARCH=86-virtual CUDA_CACHE_MAXSIZE=4294967296
bash scripts/gpu_run.sh build-lean correctness tree-decode tree-ops tbo-mmqs2 pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
