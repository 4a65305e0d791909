#!/bin/bash
# call 40, 1: fused_kvstore_short400 (past the fused rows, the short rows' launch of its own only from 400 rows).
# GPU 0: its GPU kernel tests and its break; GPU 1: the kernel bench of it against the default at 34 and 40 x 32K
# and 34, 48 and 64 x 16K (64 x 16K = 512 rows runs the same launches in both: the bench's noise). Then, both cards
# together, a sparse server at 32K x 34: short400 on GPU 0, the default on GPU 1 (call 40, 2 swaps them)
set -u
T0=$(date +%s); K=$OUT/call40_1; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
barrier() {  # both sides start their servers together (or after 300 s)
  touch $K/.ready$1; for i in $(seq 300); do [ -e $K/.ready0 ] && [ -e $K/.ready1 ] && break; sleep 1; done
}
serve() {  # card variant port
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 170 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" --port $3 \
    --out-dir $K/served_gpu$1_$2 > $K/served_gpu$1_$2.log 2>&1
  echo "served gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
   -k "short400 or late_short" > $K/kt.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 timeout 150 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
   --only single_select_launch_long_rows_only > $K/breaks.log 2>&1; echo "break rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 barrier 0; serve 0 fused_kvstore_short400 30100) &
(export CUDA_VISIBLE_DEVICES=1
 for b in "34 32768" "40 32768" "34 16384" "48 16384" "64 16384"; do set -- $b
   timeout 90 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores \
     --variants fused_kvstore_narrow,fused_kvstore_short400 --batch $1 --contexts $2 --out $K/kb_b$1_$2.json \
     > $K/kb_b$1_$2.log 2>&1; echo "bench b$1 c$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done
 barrier 1; serve 1 fused_kvstore_narrow 30200) &
wait; rm -f $K/.ready*
tail -5 $K/kt.log; tail -15 $K/breaks.log
for f in $K/kb_*.log; do echo "== $f"; grep -A4 "^ context" $f | head -4; tail -1 $f; done
grep -h "^== " $K/served_*.log | cut -c1-200; cat $K/walls.txt
cd $OUT && tar czf call40_1.tgz call40_1 && rm -rf call40_1
