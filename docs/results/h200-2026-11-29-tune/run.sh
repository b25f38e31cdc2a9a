#!/usr/bin/env bash
# session 30: `buun tune` on the H200 with the full-size synthetic pair: the pick under the
# calibrated tree profile against a separate `buun bench` sweep of the same configurations and
# workload, and the pick under a profile where trees gain (scripts/gpu_run.sh, part tune). Runs
# from a copy of the checkout, so later syncs of the tree cannot touch it.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
bash scripts/gpu_run.sh ${*:-build-lean tune} pack
echo "ALLDONE" >> /tmp/buun-gpu/results/summary.txt
