#!/bin/bash
# call 40, 4: the GPU suite at the code after call 40's variants were removed
set -u
T0=$(date +%s); K=$OUT/call40_4; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K/suite MODULE_TIMEOUT_S=500 timeout 530 bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1
echo "suite rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/suite.log; cat $K/walls.txt
cd $OUT && tar czf call40_4.tgz call40_4 && rm -rf call40_4
