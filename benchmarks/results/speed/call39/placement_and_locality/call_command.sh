#!/bin/bash
# call 39, 1: the kernel bench's sparse attention with the pages placed three ways (contiguous: a fresh server's
# prefill; random: shuffled, the bench's default; interleaved: a rollout's decode), the same keys, at 32 x 32K and
# 64 x 16K, all on GPU 0; GPU 1: which pages the dummy-weight server selects (selection_locality.py), then 32 x 32K's
# three placements in the reverse order (the card's own check)
set -u
T0=$(date +%s); K=$OUT/call39_1; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
bench() {  # card batch context placement
  CUDA_VISIBLE_DEVICES=$1 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow \
    --kernels cuda-cores --placement $4 --batch $2 --contexts $3 --out $K/kb_gpu$1_$4_b$2.json \
    > $K/kb_gpu$1_$4_b$2.log 2>&1; echo "gpu$1 $4 b$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(for b in "32 32768" "64 16384"; do set -- $b; for p in contiguous random interleaved; do bench 0 $1 $2 $p; done; done) &
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/selection_locality.py --port 30200 \
   --out-dir $K/locality_dummy_1.7b > $K/locality_dummy_1.7b.log 2>&1
 echo "locality rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 for p in interleaved random contiguous; do bench 1 32 32768 $p; done) &
wait
for f in $K/kb_*.log; do echo "== $f"; tail -4 $f; done; tail -20 $K/locality_dummy_1.7b.log; cat $K/walls.txt
cd $OUT && tar czf call39_1.tgz call39_1 && rm -rf call39_1
