#!/usr/bin/env bash
# session 30: the long suite (8192 and 30720-token prompts) of AR and DFlash at synthetic AL 7.67
# on the series whose patch 0008 leaves the prompt's rows before the draft's window out (issue
# #49's prefill target), with the step profile. Runs from a copy of the checkout.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
bash scripts/gpu_run.sh ${*:-build-lean long} pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
