#!/bin/bash
# call 47, 4 (a fresh one-H200 host): fused_stream_narrow (the scoring past the fused rows streamed by a fixed grid
# of 4 programs an SM) against the default fused_kvstore_narrow in the kernel bench at the batches past 264 rows
# (34 and 40 x 32K, rollout A's 64 at 8K and 16K, 48 x 16K); then its GPU kernel tests and two breaks of it
set -u
T0=$(date +%s); K=/tmp/k474; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
for b in "34 32768,36864" "64 8192,16384" "40 32768" "48 16384"; do set -- $b
  timeout 75 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores \
    --variants fused_kvstore_narrow,fused_stream_narrow --batch $1 --contexts $2 --out $K/kb_b$1.json > $K/kb_b$1.log 2>&1
  echo "bench $1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  grep -E "fused_(kvstore|stream)_narrow" $K/kb_b$1.log | head -8
done
left=$(( 440 - ($(date +%s) - T0) ))
timeout $(( left > 60 ? left : 60 )) python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
  -k "stream" > $K/kt.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; tail -3 $K/kt.log
left=$(( 490 - ($(date +%s) - T0) ))
[ $left -gt 40 ] && { timeout $left python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
  --only stream_share_one_tile_short stream_query_of_the_next_head > $K/breaks.log 2>&1
  echo "breaks rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; tail -4 $K/breaks.log; }
cat $K/walls.txt
tar -czf $OUT/call47_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
