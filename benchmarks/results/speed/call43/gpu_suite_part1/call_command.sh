#!/bin/bash
# call 43, 3: the GPU suite's part 1 on one H200 at the code with scaled float8 landmarks (only one-GPU hosts
# lent)
set -u
T0=$(date +%s); K=$OUT/call43_3; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K/suite MODULE_TIMEOUT_S=430 timeout 445 bash benchmarks/gpu_host/run_gpu_suite.sh 1 > $K/suite.log 2>&1
echo "suite part 1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/suite.log; cat $K/walls.txt
cd $OUT && tar czf call43_3.tgz call43_3 && rm -rf call43_3
