#!/bin/bash
# call 46, 2: the GPU suite's part 1 on one card at main's code (the query copied at every batch size)
set -u
T0=$(date +%s); K=/tmp/k462; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K/suite MODULE_TIMEOUT_S=372 timeout 384 bash benchmarks/gpu_host/run_gpu_suite.sh 1 > $K/suite.log 2>&1
echo "suite part 1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/suite.log; cat $K/walls.txt
tar -czf $OUT/call46_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
