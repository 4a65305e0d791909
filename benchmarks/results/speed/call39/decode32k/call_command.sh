#!/bin/bash
# call 39, 3: decode at 32K, batch 16 and 34 (the most the pool holds at 0.89), dense (GPU 0) and sparse (GPU 1) at
# once, the default selection (fused_kvstore_narrow), SGLang's default captured graphs: this host's figure
set -u
T0=$(date +%s); K=$OUT/call39_3; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout 280 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 \
  --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k > $K/decode32k.log 2>&1
echo "decode32k rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
grep -h "^== \|healthy\|ERROR\|speedup" $K/decode32k.log | cut -c1-300; cat $K/walls.txt
cd $OUT && tar czf call39_3.tgz call39_3 && rm -rf call39_3
