#!/bin/bash
# call 41, 2: fused_kvstore_hybrid against the default at 32K x 34 with graphs captured at 33 and 34 too (call 41, 1
# served 34 requests in SGLang's graph of 40, 320 rows, where the hybrid launch fuses 208): a sparse server on each
# card at once (hybrid GPU 0, default GPU 1), then the two swapped across the cards
set -u
T0=$(date +%s); K=$OUT/call41_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
EXACT="--cuda-graph-bs-decode 1 2 4 8 12 16 24 32 33 34 40 48 56 64"
serve() {  # card variant port run
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 200 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89 $EXACT" \
    --port $3 --out-dir $K/served$4_gpu$1_$2 > $K/served$4_gpu$1_$2.log 2>&1
  echo "served$4 gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(serve 0 fused_kvstore_hybrid 30100 1; serve 0 fused_kvstore_narrow 30100 2) &
(serve 1 fused_kvstore_narrow 30200 1; serve 1 fused_kvstore_hybrid 30200 2) &
wait
for f in $K/served*.log; do echo "$f $(grep -h '^== ' $f | cut -c1-120)"; done; cat $K/walls.txt
cd $OUT && tar czf call41_2.tgz call41_2 && rm -rf call41_2
