#!/bin/bash
# call 44, 5: the GPU suite's part 3 (trainer compat) on one card at this session's code
set -u
T0=$(date +%s); K=$OUT/call44_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K/suite MODULE_TIMEOUT_S=520 timeout 535 bash benchmarks/gpu_host/run_gpu_suite.sh 3 > $K/suite.log 2>&1
echo "suite part 3 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/suite.log; cat $K/walls.txt
cd $OUT && tar czf call44_5.tgz call44_5 && rm -rf call44_5
