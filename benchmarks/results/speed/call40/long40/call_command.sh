#!/bin/bash
# call 40, 3: fused_kvstore_long40 (past the fused rows, the split top-k's long rows under 40 registers: 3 programs an
# SM, 396 rows in one wave). GPU 0: the GPU tests of the long40 variants and short400's break; GPU 1: the kernel
# bench of the default, short400, long40 and long40_short400 at 34 and 40 x 32K and 48 x 16K. Then a sparse server
# at 32K x 34 on each card, long40 and the default, one after the other, in opposite orders on the two cards
set -u
T0=$(date +%s); K=$OUT/call40_3; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
serve() {  # card variant port run
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SELECT_VARIANT=$2 timeout 140 python3 benchmarks/sglang_throughput.py \
    --decode 32768x34 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" --port $3 \
    --out-dir $K/served$4_gpu$1_$2 > $K/served$4_gpu$1_$2.log 2>&1
  echo "served$4 gpu$1 $2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 170 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "long40" \
   > $K/kt.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 timeout 100 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
   --only single_select_launch_long_rows_only > $K/breaks.log 2>&1; echo "break rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 serve 0 fused_kvstore_long40 30100 1; serve 0 fused_kvstore_narrow 30100 2) &
(export CUDA_VISIBLE_DEVICES=1
 for b in "34 32768" "40 32768" "48 16384"; do set -- $b
   timeout 100 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores --batch $1 --contexts $2 \
     --variants fused_kvstore_narrow,fused_kvstore_short400,fused_kvstore_long40,fused_kvstore_long40_short400 \
     --out $K/kb_b$1_$2.json > $K/kb_b$1_$2.log 2>&1; echo "bench b$1 c$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 done
 serve 1 fused_kvstore_narrow 30200 1; serve 1 fused_kvstore_long40 30200 2) &
wait
tail -4 $K/kt.log; grep -o '"caught": [a-z]*' $K/breaks.log
for f in $K/kb_*.log; do echo "== $f"; grep -A6 "^ context" $f | head -6; done
for f in $K/served*.log; do echo "$f $(grep -h '^== ' $f | cut -c1-110)"; done; cat $K/walls.txt
cd $OUT && tar czf call40_3.tgz call40_3 && rm -rf call40_3
