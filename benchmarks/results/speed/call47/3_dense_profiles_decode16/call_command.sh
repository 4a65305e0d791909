#!/bin/bash
# call 47, 3 (the same host, warm): per-layer profiles of one dense decode graph replay at rollout A's shape,
# 64 requests at 16K and at 8K of context, beside call 2's sparse ones; then decode 32K x 16, dense then sparse
set -u
T0=$(date +%s); K=/tmp/k473; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
for C in 16384 8192; do
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 60 ] || break
  timeout -s INT $left python3 benchmarks/decode_profile.py --backends flashinfer --context $C --batch 64 \
     --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_${C}_b64 > $K/profile_${C}_b64.log 2>&1
  echo "profile $C rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
done
left=$(( 585 - ($(date +%s) - T0) ))
[ $left -gt 200 ] && { timeout -s INT $left python3 benchmarks/sglang_throughput.py --decode 32768x16 --rollout-gen 0 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k_b16 > $K/decode32k_b16.log 2>&1
   echo "decode 32K x 16 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; tail -3 $K/decode32k_b16.log; }
rm -f $K/profile_*/server-profile-*.log.gz; cat $K/walls.txt
tar -czf $OUT/call47_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
