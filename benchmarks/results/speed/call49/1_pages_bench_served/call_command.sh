#!/bin/bash
# call 49, 1 (a 2 x H200 host): on GPU 0, fused_pages_narrow (the scoring past the fused rows by whole pages, shaped
# as call 48's read-only gather) against the default fused_kvstore_narrow in the kernel bench past 264 rows (1.7B and
# 4B shapes), its GPU kernel tests, two breaks of it, then Qwen3-4B's sparse attention under the tensor-core kernel's
# other plans; beside it on GPU 1, the sparse server alone (--backends sparrow) at decode 32K x 16 and x 34 with
# SPARROW_SELECT_VARIANT=fused_pages_narrow, then the default, the same command on the same card; then rollout A's
# sparse half with fused_pages_narrow (call 47's with the default: 7,489.1 tok/s on another host)
set -u
T0=$(date +%s); K=/tmp/k491; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  for b in "34 32768,36864" "64 8192,16384" "40 32768" "48 16384"; do set -- $b
    timeout 75 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores \
      --variants fused_kvstore_narrow,fused_pages_narrow --batch $1 --contexts $2 --out $K/kb_b$1.json > $K/kb_b$1.log 2>&1
    echo "gpu0 bench $1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  done
  timeout 90 python3 benchmarks/sparse_kernel_bench.py --group 4 --schedule qwen3-4b-0.86 \
    --variants fused_kvstore_narrow,fused_pages_narrow --batch 48 --contexts 8192,16384 --out $K/kb4b_b48.json > $K/kb4b_b48.log 2>&1
  echo "gpu0 bench 4b rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k whole_page > $K/kt.log 2>&1
  echo "gpu0 tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  timeout 120 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
    --only pages_share_one_page_short pages_query_of_the_next_head > $K/breaks.log 2>&1
  echo "gpu0 breaks rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 40 ] && {
  timeout $left python3 benchmarks/sparse_kernel_bench.py --group 4 --schedule qwen3-4b-0.86 --variants fused_kvstore_narrow \
    --kernels tensor-cores,tensor-cores:nosplit,tensor-cores:split=32,tensor-cores:parts=2 --batch 48 --contexts 8192,16384 \
    --out $K/kb4b_plans.json > $K/kb4b_plans.log 2>&1
  echo "gpu0 4b plans rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; }
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  for V in fused_pages_narrow fused_kvstore_narrow; do
    SPARROW_SELECT_VARIANT=$V timeout -s INT 200 python3 benchmarks/sglang_throughput.py --backends sparrow \
      --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/sparse_$V \
      > $K/sparse_$V.log 2>&1
    echo "gpu1 sparse decode $V rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  done
  left=$(( 575 - ($(date +%s) - T0) )); [ $left -gt 150 ] && {
  SPARROW_SELECT_VARIANT=fused_pages_narrow timeout -s INT $left python3 benchmarks/sglang_throughput.py --backends sparrow \
    --decode "" --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 \
    --server-args "--mem-fraction-static 0.89" --time-budget-s 1200 --out-dir $K/rolloutA_sparse_pages > $K/rolloutA_sparse_pages.log 2>&1
  echo "gpu1 rollout A sparse pages rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; }
}
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv -lms 1000 > $K/smi.csv 2>&1 & SMI=$!
gpu0 & P0=$!; gpu1 & P1=$!; wait $P0 $P1
kill $SMI
grep -hE "fused_(kvstore|pages)_narrow" $K/kb_b*.log $K/kb4b_b48.log | head -30; tail -3 $K/kt.log; tail -4 $K/breaks.log
grep -h "decode_ctx\|rollout:" $K/sparse_*.log $K/rolloutA_sparse_pages.log
cat $K/walls.txt
tar -czf $OUT/call49_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
