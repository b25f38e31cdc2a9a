#!/usr/bin/env bash
# session 31: the DFlash2 recipe (issue #48): its full-size synthetic pair, AR and DFlash2 at
# synthetic AL 1 and 6 against upstream, the Q8_0 drafter, and its harness on CUDA.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
bash scripts/gpu_run.sh ${*:-build-lean dflash2} pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
