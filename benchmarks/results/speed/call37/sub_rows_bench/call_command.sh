#!/bin/bash
# call 37, 4: sub-rows at query-dtype partials: GPU test and the kernel module's attention tests on GPU 0; the bench
# of 2, 4, 8 sub-rows against the default from batch 16 to 64 on GPU 1
K=$OUT/call37_4; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
B=benchmarks/sparse_kernel_bench.py; V="--variants fused_kvstore_narrow"
KS=cuda-cores,tensor-cores:parts=2,tensor-cores:parts=4,tensor-cores:parts=8
(export CUDA_VISIBLE_DEVICES=0; T0=$(date +%s)
 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "sub_rows or sparse_layer_equals" \
   > $K/kt.log 2>&1; echo "tests exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt
 for bc in "24 32768" "33 32768" "48 16384"; do set -- $bc; T0=$(date +%s)
 timeout 120 python3 $B $V --batch $1 --contexts $2 --kernels $KS --out $K/b$1_$2.json > $K/b$1_$2.log 2>&1
 echo "bench b$1 $2 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done) &
(export CUDA_VISIBLE_DEVICES=1; sleep 10; for bc in "34 32768" "64 16384" "16 32768" "28 32768" "40 16384"; do set -- $bc
 T0=$(date +%s); timeout 120 python3 $B $V --batch $1 --contexts $2 --kernels $KS --out $K/b$1_$2.json > $K/b$1_$2.log 2>&1
 echo "bench b$1 $2 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done) &
wait
cat $K/walls.txt; tail -3 $K/kt.log
for f in $K/b*.log; do echo "$f"; grep -A5 "sparse.*TB/s.*dense" $f | tail -4; done
