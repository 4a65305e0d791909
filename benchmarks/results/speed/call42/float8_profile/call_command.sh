#!/bin/bash
# call 42, 5: a per-layer profile of one decode graph replay at 32K x 16, the sparse server with float8 landmarks
# (SPARROW_LANDMARK_DTYPE=float8_e4m3fn): where call 4's served float8 decode lost its time
set -u
T0=$(date +%s); K=$OUT/call42_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
SPARROW_LANDMARK_DTYPE=float8_e4m3fn timeout -s INT 250 python3 benchmarks/decode_profile.py --context 32768 \
  --batch 16 --backends sparrow --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_32k_b16_fp8 \
  > $K/profile_fp8.log 2>&1
echo "profile rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -40 $K/profile_fp8.log; cat $K/walls.txt
cd $OUT && tar czf call42_5.tgz call42_5 && rm -rf call42_5
