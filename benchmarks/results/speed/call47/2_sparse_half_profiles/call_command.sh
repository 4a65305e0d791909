#!/bin/bash
# call 47, 2 (call 1's host, warm): the sparse half of call 1's command (--backends sparrow), then per-layer
# profiles of one sparse decode graph replay at rollout A's shape: 64 requests at 16K and at 8K of context
set -u
T0=$(date +%s); K=/tmp/k472; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 > $K/smi.csv 2>&1 & SMI=$!
timeout -s INT 400 python3 benchmarks/sglang_throughput.py --backends sparrow \
   --decode 32768x34 --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 \
   --server-args "--mem-fraction-static 0.89" --time-budget-s 1200 --out-dir $K/sparse > $K/sparse.log 2>&1
echo "sparse rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
kill $SMI; tail -4 $K/sparse.log
for C in 16384 8192; do
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 60 ] || break
  timeout -s INT $left python3 benchmarks/decode_profile.py --backends sparrow --context $C --batch 64 \
     --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_${C}_b64 > $K/profile_${C}_b64.log 2>&1
  echo "profile $C rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
done
rm -f $K/profile_*/server-profile-*.log.gz; cat $K/walls.txt
tar -czf $OUT/call47_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
