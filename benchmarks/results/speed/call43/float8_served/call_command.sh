#!/bin/bash
# call 43, 2: decode at 32K x 16 and x 34 on one H200: the dense server then the sparse one with float8 landmarks (scaled per page and head)
# (SPARROW_LANDMARK_DTYPE=float8_e4m3fn; the dense server does not read it), then the sparse one with bfloat16
# landmarks (the default) on the same card
set -u
T0=$(date +%s); K=$OUT/call43_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
SPARROW_LANDMARK_DTYPE=float8_e4m3fn timeout -s INT 330 python3 benchmarks/sglang_throughput.py \
  --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" \
  --out-dir $K/decode32k_fp8 > $K/decode32k_fp8.log 2>&1
echo "dense + sparse float8 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
timeout -s INT $(( 560 - ($(date +%s) - T0) )) python3 benchmarks/sglang_throughput.py --backends sparrow \
  --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" \
  --out-dir $K/decode32k_bf16 > $K/decode32k_bf16.log 2>&1
echo "sparse bfloat16 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
grep -h "^== \|healthy\|decode_ctx" $K/decode32k_*.log | cut -c1-250; cat $K/walls.txt
cd $OUT && tar czf call43_2.tgz call43_2 && rm -rf call43_2
