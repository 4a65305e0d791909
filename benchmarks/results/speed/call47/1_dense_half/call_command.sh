#!/bin/bash
# call 47, 1: the dense half on one H200 at main's code, one invocation (--backends flashinfer): decode 32K x 34,
# then rollout A 64 x (1K + 16K); nvidia-smi every 500 ms beside it (clocks, power). Call 2 runs the sparse half
# with the same command on the same card (the same seeded prompts), then per-layer profiles at rollout A's shape.
set -u
T0=$(date +%s); K=/tmp/k471; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 > $K/smi.csv 2>&1 & SMI=$!
timeout -s INT $(( 580 - ($(date +%s) - T0) )) python3 benchmarks/sglang_throughput.py --backends flashinfer \
   --decode 32768x34 --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 \
   --server-args "--mem-fraction-static 0.89" --time-budget-s 1200 --out-dir $K/dense > $K/dense.log 2>&1
echo "dense rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
kill $SMI; tail -6 $K/dense.log; cat $K/walls.txt
tar -czf $OUT/call47_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
