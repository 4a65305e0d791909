#!/bin/bash
# call 42, 6: the break prefill_landmark_over_15_tokens against the landmark kernel's GPU test (its float32 and float8
# cases)
set -u
T0=$(date +%s); K=$OUT/call42_6; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout 150 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
  --only prefill_landmark_over_15_tokens > $K/breaks.log 2>&1
echo "break rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -5 $K/breaks.log; cat $K/breaks/breaks.jsonl; grep -h "FAILED\|passed\|failed" $K/breaks/*.log | tail -5; cat $K/walls.txt
cd $OUT && tar czf call42_6.tgz call42_6 && rm -rf call42_6
