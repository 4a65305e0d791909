#!/bin/bash
# call 44, 2: the same as call 44, 1 without --enable-torch-compile, on the same host right after it (the baseline)
set -u
T0=$(date +%s); K=$OUT/call44_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout -s INT 560 python3 benchmarks/sglang_throughput.py --decode 32768x16 --rollout-gen 0 --time-budget-s 540 \
  --server-args "--mem-fraction-static 0.89 --cuda-graph-bs-decode 16" \
  --out-dir $K/decode32k_nocompile > $K/decode32k_nocompile.log 2>&1
echo "dense + sparse, no compile rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
grep -h "^== \|healthy\|decode_ctx\|Error\|error" $K/decode32k_*.log | cut -c1-250 | head -30
grep -h -i "compile\|capture cuda graph\|graph break" $K/decode32k_nocompile/server-*.log | cut -c1-200 | head -20
cat $K/walls.txt
cd $OUT && tar czf call44_2.tgz call44_2 && rm -rf call44_2
