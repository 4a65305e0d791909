#!/bin/bash
# call 44, 4: the GPU suite's part 2 on one card at this session's code (the served float8 selection test among the
# serving module's now; the backend's layer calls torch.compile graph breaks); module timeout 560 s
set -u
T0=$(date +%s); K=$OUT/call44_4; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K/suite MODULE_TIMEOUT_S=560 timeout 575 bash benchmarks/gpu_host/run_gpu_suite.sh 2 > $K/suite.log 2>&1
echo "suite part 2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/suite.log; cat $K/walls.txt
cd $OUT && tar czf call44_4.tgz call44_4 && rm -rf call44_4
