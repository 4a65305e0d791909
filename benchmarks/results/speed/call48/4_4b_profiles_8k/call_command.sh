#!/bin/bash
# call 48, 4 (calls 1-3's host, warm, the session's last device time): per-layer profiles of the dense and sparse
# Qwen3-4B servers at 48 x 8K (rollout A's first wave at half its length), one invocation
set -u
T0=$(date +%s); K=/tmp/k484; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout -s INT 330 python3 benchmarks/decode_profile.py --size qwen3-4b --backends flashinfer,sparrow --context 8192 --batch 48 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_4b_8k_b48 > $K/profile_4b_8k_b48.log 2>&1
echo "profile 4b 8k rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
rm -f $K/profile_*/server-profile-*.log.gz; cat $K/walls.txt
tar -czf $OUT/call48_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
