# run 3 (a third H200 lease, 2026-11-28): 0045's first form (the host path unpadded) on CUDA: the
# harness's tree and feature tests, then the tree's sweep with LLAMA_DFLASH_PATH_PAD on and off in one run.
set -u
export W=/tmp/buun-gpu
R=$W/results
mkdir -p $W
save() { (cd $W && tar czf "$OUT/partial.tgz" --exclude='*.gguf' results driver*.log 2>/dev/null); }
bash scripts/gpu_run.sh build-lean > $W/driver1.log 2>&1; save
export BUUN_LLAMA_BIN_DIR=$PWD/vendor/build/cuda/bin
GPU_HARNESS_K="trees_path_reaches or device_features_draft or tree_greedy or one_candidate or drafter_keeps_both" \
    bash scripts/gpu_run.sh correctness > $W/driver2.log 2>&1; save
GPU_TREE_BUDGETS=15,22 bash scripts/gpu_run.sh tree-sweep > $W/driver3.log 2>&1
mv $R/tree-sweep $R/tree-sweep-pad1; mv $R/tree-sweep.log $R/tree-sweep-pad1.log; save
LLAMA_DFLASH_PATH_PAD=0 GPU_TREE_BUDGETS=22 bash scripts/gpu_run.sh tree-sweep > $W/driver4.log 2>&1
mv $R/tree-sweep $R/tree-sweep-pad0; mv $R/tree-sweep.log $R/tree-sweep-pad0.log; save
bash scripts/gpu_run.sh pack > $W/driver5.log 2>&1; cp $W/results.tgz $OUT/ 2>/dev/null; save
