#!/bin/bash
# call 48, 2 (call 1's host, warm): Qwen3-4B rollout A's sparse half on one card (--backends sparrow; call 3 runs the
# dense half with the same command), then a per-layer profile of the sparse Qwen3-4B server at 48 x 16K (call 1's
# dense one's shape: rollout A's first wave)
set -u
T0=$(date +%s); K=/tmp/k482; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
timeout -s INT 420 python3 benchmarks/sglang_throughput.py --sizes qwen3-4b --backends sparrow --decode "" \
   --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 \
   --server-args "--mem-fraction-static 0.89" --time-budget-s 1200 --out-dir $K/sparse > $K/sparse.log 2>&1
echo "sparse rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
left=$(( 585 - ($(date +%s) - T0) ))
timeout -s INT $left python3 benchmarks/decode_profile.py --size qwen3-4b --backends sparrow --context 16384 --batch 48 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_4b_sparse_16k_b48 > $K/profile_4b_sparse_16k_b48.log 2>&1
echo "profile 4b sparse rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
rm -f $K/profile_*/server-profile-*.log.gz; cat $K/walls.txt; tail -n 4 $K/sparse.log
tar -czf $OUT/call48_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
