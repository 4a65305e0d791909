#!/bin/bash
# call 39, 2: served sparse decode at 32K x 34 (the most the pool holds at 0.89) in SGLang's default captured graphs
# (34 requests replay the graph of 40) on GPU 0 beside graphs captured at 33 and 34 too on GPU 1, sparse servers only,
# two at once; then the same two swapped across the cards
set -u
T0=$(date +%s); K=$OUT/call39_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
EXACT="--cuda-graph-bs-decode 1 2 4 8 12 16 24 32 33 34 40 48 56 64"
run() {  # card name port extra-server-args
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$1 timeout 200 python3 benchmarks/sglang_throughput.py --decode 32768x34 --rollout-gen 0 \
    --backends sparrow --server-args "--mem-fraction-static 0.89 $4" --port $3 --out-dir $K/$2 > $K/$2.log 2>&1
  echo "$2 card $1 rc $? wall $(( $(date +%s) - t0 )) s at $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(run 0 gpu0_default_graphs 30100 ""; run 0 gpu0_exact_graphs 30100 "$EXACT") &
(run 1 gpu1_exact_graphs 30200 "$EXACT"; run 1 gpu1_default_graphs 30200 "") &
wait
grep -h "^== \|healthy\|ERROR\|cuda_graph_bs\|Capture cuda graph bs" $K/*.log | cut -c1-300
cat $K/walls.txt
cd $OUT && tar czf call39_2.tgz call39_2 && rm -rf call39_2
