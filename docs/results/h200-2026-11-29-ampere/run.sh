#!/usr/bin/env bash
# session 29: the folded series (0001-0030) built for Ampere's compute_86 as PTX only (the driver
# compiles it for the H200 at load): the whole CUDA harness, test-tree-decode, the tree ops, the
# small-batch kernel's MUL_MAT cases and the series' other kernels against the CPU, all on the code
# a 3090 would get. Runs from a copy of the checkout, so later syncs of the tree cannot touch it.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
export GPU_CUDA_ARCH=86-virtual CUDA_CACHE_MAXSIZE=4294967296
# the first call named no parts; the second, after the like-sampler check's fix (814064e):
# GPU_HARNESS_K=like_sampler bash docs/results/h200-2026-11-29-ampere/run.sh build-lean correctness
bash scripts/gpu_run.sh ${*:-build-lean correctness tree-decode tree-ops tbo-mmqs2 tbo-ops} pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
