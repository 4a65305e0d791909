#!/bin/bash
# call 40, 2: call 40, 1's served pair swapped across the cards: a sparse server at 32K x 34 on each card at once,
# the default (fused_kvstore_narrow) on GPU 0, fused_kvstore_short400 on GPU 1; then both again, swapped back
set -u
T0=$(date +%s); K=$OUT/call40_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
serve() {  # card variant port run
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 170 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" --port $3 \
    --out-dir $K/served$4_gpu$1_$2 > $K/served$4_gpu$1_$2.log 2>&1
  echo "served$4 gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(serve 0 fused_kvstore_narrow 30100 1; serve 0 fused_kvstore_short400 30100 2) &
(serve 1 fused_kvstore_short400 30200 1; serve 1 fused_kvstore_narrow 30200 2) &
wait
for f in $K/served*.log; do echo "$f $(grep -h '^== ' $f | cut -c1-120)"; done; cat $K/walls.txt
cd $OUT && tar czf call40_2.tgz call40_2 && rm -rf call40_2
