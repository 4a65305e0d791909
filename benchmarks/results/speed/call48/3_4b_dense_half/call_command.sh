#!/bin/bash
# call 48, 3 (calls 1-2's host, warm): Qwen3-4B rollout A's dense half on one card (--backends flashinfer), call 2's
# command otherwise; nvidia-smi every 500 ms beside it (clocks, power)
set -u
T0=$(date +%s); K=/tmp/k483; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 > $K/smi.csv 2>&1 & SMI=$!
timeout -s INT $(( 588 - ($(date +%s) - T0) )) python3 benchmarks/sglang_throughput.py --sizes qwen3-4b --backends flashinfer \
   --decode "" --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 \
   --server-args "--mem-fraction-static 0.89" --time-budget-s 1200 --out-dir $K/dense > $K/dense.log 2>&1
echo "dense rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
kill $SMI; cat $K/walls.txt; tail -n 3 $K/dense.log
tar -czf $OUT/call48_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
