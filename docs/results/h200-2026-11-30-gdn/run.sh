#!/usr/bin/env bash
# session 35, issue #49 (journal 2026-11-30, section 56): the gated delta net's kernel (patch 0001)
# with one reduction a token, in variants: 16 or 32 lanes a column, the next token's inputs loaded a
# token ahead (pf) or a stage of 8 tokens' inputs in shared memory at once (st). variants.diff (applied
# over the series) carries them all behind switches of this run alone: GGML_CUDA_GDN_CHAIN=pf16|st16|
# pf32|st32, GGML_CUDA_GDN_TREE=pf16|pf32|old, GGML_CUDA_GDN_OLD=1 (the kernel of a warp a column for
# both; the series keeps pf16 for chains and that kernel for trees). Each is checked against the CPU
# and timed at 1, 4 and 8 sequences; the chain's fastest at four sequences then serves four slots at
# synthetic AL 7.67, and the chain at AL 1 / 7.67 / 8.31 beside AR (~12 min on 16 cores).
# The recorded run stopped in its bench (the session's device time ran out): summary.txt says what
# came back, and the lines of an earlier run of pf16 against the old kernel.
set -u
cd "$(dirname "$0")/../../.."
rm -rf /tmp/buun-snap && cp -a . /tmp/buun-snap && cd /tmp/buun-snap || exit 1
export GPU_EXTRA_DIFF=docs/results/h200-2026-11-30-gdn/variants.diff
bash scripts/gpu_run.sh build-lean || exit 1
. scripts/gpu_lib.sh
export BUUN_LLAMA_BIN_DIR=$BIN
gpu_tbo_build
step tree-ssm 300 "$BIN/test-tree-ssm"
tail -1 "$RES/tree-ssm.log" | tee -a "$RES/summary.txt"
variants=(CHAIN=pf16 CHAIN=st16 CHAIN=pf32 CHAIN=st32 TREE=pf16 TREE=pf32 TREE=old OLD=1)
for v in "${variants[@]}"; do
    op=GATED_DELTA_NET; [ "${v%%=*}" = TREE ] && op=GATED_DELTA_NET_TREE
    [ "$v" = OLD=1 ] || gpu_tbo "v-$v" "GGML_CUDA_GDN_$v" test -o "$op"
    gpu_tbo "pv-$v" "GGML_CUDA_GDN_$v" perf -o "$op" -p "head_count=16,head_size=128"
done
step tree-ssm-pf32 300 env GGML_CUDA_GDN_TREE=pf32 "$BIN/test-tree-ssm"
tail -1 "$RES/tree-ssm-pf32.log" | tee -a "$RES/summary.txt"
# the chain variant fastest at four sequences of 16 tokens
best=$(for v in pf16 st16 pf32 st32; do
    us=$(grep "n_seq_tokens=16,n_seqs=4," "$RES/tbo-pv-CHAIN=$v.log" | sed -E 's/.* ([0-9.]+) us\/run.*/\1/')
    echo "$us $v"; done | sort -n | head -1 | cut -d' ' -f2)
log "chain variant for the benches: $best"
gpu_slots "s4-$best-1" 4 4 512 "GGML_CUDA_GDN_CHAIN=$best" --
step bench 600 env LLAMA_SPEC_PROFILE=1 "GGML_CUDA_GDN_CHAIN=$best" $BUUN bench "${BENCH[@]}" --synthetic-al 1 \
    --synthetic-al 7.67 --synthetic-al 8.31 --prompts 2 --n-predict 512 --out "$RES/bench"
for f in "$RES"/bench/server-*.log; do
    grep "spec profile" "$f" | tail -1 | sed "s|^.*spec profile: |bench/$(basename "$f"): |" >> "$RES/profile.txt"
done
python3 - "$RES/bench/bench.json" >> "$RES/summary.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("bench |", "; ".join(f"{r['config']}: {r['decode_tps']:.1f} tok/s AL {r.get('mean_al') or 0:.2f}"
                           for r in d["summary"]))
PY
gpu_slots "s4-$best-2" 4 4 512 "GGML_CUDA_GDN_CHAIN=$best" --
gpu_slots s4-old-1 4 4 512 GGML_CUDA_GDN_OLD=1 --
echo "ALLDONE" >> "$RES/summary.txt"
