#!/bin/bash
# call 43, 1: float8 landmarks with a power-of-two scale per page and KV head: the GPU kernel tests of the landmark
# dtypes, the two new breaks of the scaled float8 path, then the kernel bench of the default selection with bfloat16
# and float8 landmarks at 16 and 34 x 32K, 64 x 16K
set -u
T0=$(date +%s); K=$OUT/call43_1; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
  -k "landmark_kernel_matches or scores_and_indices or narrow_landmarks" > $K/kt.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
timeout 150 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
  --only float8_landmark_scale_dropped float8_landmark_stored_twice_its_scale > $K/breaks.log 2>&1
echo "breaks rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
for b in "16 32768" "34 32768" "64 16384"; do set -- $b; for dt in bfloat16 float8_e4m3fn; do
  timeout 80 python3 benchmarks/sparse_kernel_bench.py --kernels cuda-cores --variants fused_kvstore_narrow \
    --landmark-dtype $dt --batch $1 --contexts $2 --out $K/kb_b$1_$2_$dt.json > $K/kb_b$1_$2_$dt.log 2>&1
  echo "bench b$1 c$2 $dt rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done; done
tail -5 $K/kt.log; tail -4 $K/breaks.log; cat $K/breaks/breaks.jsonl
for f in $K/kb_*.log; do echo "== $f"; grep -A4 "^ context" $f | head -4; tail -1 $f; done
cat $K/walls.txt
cd $OUT && tar czf call43_1.tgz call43_1 && rm -rf call43_1
