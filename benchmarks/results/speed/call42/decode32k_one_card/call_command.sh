#!/bin/bash
# call 42, 2: decode at 32K x 16 and x 34 on one H200, the dense server then the sparse one back to back (only
# one-GPU hosts lent), at main's code
set -u
T0=$(date +%s); K=$OUT/call42_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout -s INT 560 python3 benchmarks/sglang_throughput.py --decode 32768x16,32768x34 --rollout-gen 0 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k > $K/decode32k.log 2>&1
echo "decode32k rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -30 $K/decode32k.log; cat $K/walls.txt
cd $OUT && tar czf call42_2.tgz call42_2 && rm -rf call42_2
