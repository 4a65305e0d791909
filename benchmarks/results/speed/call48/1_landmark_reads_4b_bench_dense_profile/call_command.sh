#!/bin/bash
# call 48, 1 (one H200, the only kind lent): (a) the kernel bench's read-only passes over the landmark rows the scoring
# reads (landmark_reads) at the default selection, 34 x 32K, 64 x 16K, 16 x 32K; (b) the kernel bench at Qwen3-4B's
# shape (group 4, schedule qwen3-4b-0.86, tensor-core attention: SGLang's pick at group 4) at rollout A's two waves,
# 48 and 16 requests at 8K and 16K; (c) a per-layer profile of the dense Qwen3-4B server at 48 x 16K
set -u
T0=$(date +%s); K=/tmp/k481; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
for b in "34 32768" "64 16384" "16 32768"; do set -- $b
  timeout 70 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores --variants fused_kvstore_narrow \
    --batch $1 --contexts $2 --out $K/kb_b$1.json > $K/kb_b$1.log 2>&1
  echo "bench $1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
done
for b in 48 16; do
  timeout 90 python3 benchmarks/sparse_kernel_bench.py --group 4 --schedule qwen3-4b-0.86 --variants fused_kvstore_narrow \
    --batch $b --contexts 8192,16384 --out $K/kb4b_b$b.json > $K/kb4b_b$b.log 2>&1
  echo "bench 4b $b rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
done
left=$(( 585 - ($(date +%s) - T0) ))
timeout -s INT $left python3 benchmarks/decode_profile.py --size qwen3-4b --backends flashinfer --context 16384 --batch 48 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_4b_dense_16k_b48 > $K/profile_4b_dense_16k_b48.log 2>&1
echo "profile 4b dense rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
rm -f $K/profile_*/server-profile-*.log.gz; cat $K/walls.txt; tail -3 $K/*.log
tar -czf $OUT/call48_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
