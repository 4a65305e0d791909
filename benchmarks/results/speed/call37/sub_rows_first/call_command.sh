#!/bin/bash
# call 37, 3: sub-rows merged (tensor cores, each sub-row unsplit) against the default: GPU test and breaks on GPU 0,
# the kernel bench on GPU 1
K=$OUT/call37_3; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
B=benchmarks/sparse_kernel_bench.py; V="--variants fused_kvstore_narrow"
KS=cuda-cores,tensor-cores:split=64,tensor-cores:parts=4:fp32,tensor-cores:parts=4,tensor-cores:parts=2:fp32,tensor-cores:parts=8:fp32
(export CUDA_VISIBLE_DEVICES=0; T0=$(date +%s)
 timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "sub_rows or sparse_layer_equals" \
   > $K/kt.log 2>&1; echo "tests exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; T0=$(date +%s)
 timeout 200 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks --timeout-s 180 \
   --only merge_natural_log sub_rows_last_page_full > $K/breaks.log 2>&1
 echo "breaks exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
(export CUDA_VISIBLE_DEVICES=1; sleep 10; for bc in "34 32768" "64 16384" "16 32768" "28 32768"; do set -- $bc; T0=$(date +%s)
 timeout 150 python3 $B $V --batch $1 --contexts $2 --kernels $KS --out $K/b$1_$2.json > $K/b$1_$2.log 2>&1
 echo "bench b$1 $2 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done) &
wait
cat $K/walls.txt; tail -3 $K/kt.log; cat $K/breaks.log | tail -5
for f in $K/b*.log; do grep -A8 "sparse.*TB/s.*dense" $f | tail -7; done
