#!/bin/bash
# call 39, 7: fused_kvstore_wide3 (the fused launch at 265-396 rows, 3 row programs an SM under 40 registers).
# GPU 0: its GPU kernel tests, then a sparse server on it at 32K x 34; GPU 1: the kernel bench of it against the
# default at 34 and 40 requests x 32K, then a sparse server on the default at 32K x 34 (two servers at once)
set -u
T0=$(date +%s); K=$OUT/call39_7; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
serve() {  # card variant port
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 150 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" --port $3 \
    --out-dir $K/served_gpu$1_$2 > $K/served_gpu$1_$2.log 2>&1
  echo "served gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
   -k "wide3 or wide_launch" > $K/kt.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 serve 0 fused_kvstore_wide3 30100) &
(for b in 34 40; do CUDA_VISIBLE_DEVICES=1 timeout 70 python3 benchmarks/sparse_kernel_bench.py \
   --variants fused_kvstore_narrow,fused_kvstore_wide3 --kernels cuda-cores --batch $b --contexts 32768 \
   --out $K/kb_b$b.json > $K/kb_b$b.log 2>&1; echo "bench b$b rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done
 serve 1 fused_kvstore_narrow 30200) &
wait
tail -5 $K/kt.log; for f in $K/kb_*.log; do echo "== $f"; grep -A4 "^ context" $f | head -4; tail -1 $f; done
grep -h "^== " $K/served_*.log | cut -c1-200; cat $K/walls.txt
cd $OUT && tar czf call39_7.tgz call39_7 && rm -rf call39_7
