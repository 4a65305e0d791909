#!/bin/bash
# call 41, 1: fused_kvstore_hybrid against the default: GPU 0 its GPU tests and its break; GPU 1 the kernel bench at
# 34 and 40 x 32K, 34 and 48 x 16K; then a sparse server at 32K x 34 on each card at once (hybrid GPU 0, default GPU 1)
set -u
T0=$(date +%s); K=$OUT/call41_1; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
barrier() {  # both sides start their servers together (or after 300 s)
  touch $K/.ready$1; for i in $(seq 300); do [ -e $K/.ready0 ] && [ -e $K/.ready1 ] && break; sleep 1; done
}
serve() {  # card variant port
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 200 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" --port $3 \
    --out-dir $K/served_gpu$1_$2 > $K/served_gpu$1_$2.log 2>&1
  echo "served gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
   -k hybrid > $K/kt.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 timeout 150 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
   --only hybrid_request_unscored > $K/breaks.log 2>&1; echo "break rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 barrier 0; serve 0 fused_kvstore_hybrid 30100) &
(export CUDA_VISIBLE_DEVICES=1
 for b in "34 32768" "40 32768" "34 16384" "48 16384"; do set -- $b
   timeout 90 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores \
     --variants fused_kvstore_narrow,fused_kvstore_hybrid --batch $1 --contexts $2 --out $K/kb_b$1_$2.json \
     > $K/kb_b$1_$2.log 2>&1; echo "bench b$1 c$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done
 barrier 1; serve 1 fused_kvstore_narrow 30200) &
wait; rm -f $K/.ready*
tail -5 $K/kt.log; tail -15 $K/breaks.log
for f in $K/kb_*.log; do echo "== $f"; grep -A4 "^ context" $f | head -4; tail -1 $f; done
grep -h "^== " $K/served_*.log | cut -c1-200; cat $K/walls.txt
cd $OUT && tar czf call41_1.tgz call41_1 && rm -rf call41_1
