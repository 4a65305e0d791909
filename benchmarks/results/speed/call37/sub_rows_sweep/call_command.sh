#!/bin/bash
# call 37, 6: where FlashInfer's CUDA-core sparse decode falls off and sub-rows win: batches 30-44 at 32K (GPU 0),
# 33-80 at 16K (GPU 1)
K=$OUT/call37_6; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
B=benchmarks/sparse_kernel_bench.py; V="--variants fused_kvstore_narrow"; KS=cuda-cores,tensor-cores:parts=2,tensor-cores:parts=4
sweep() { for b in $2; do T0=$(date +%s)
  timeout 60 python3 $B $V --batch $b --contexts $1 --kernels $KS --out $K/b${b}_$1.json > $K/b${b}_$1.log 2>&1
  echo "bench b$b $1 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done; }
(export CUDA_VISIBLE_DEVICES=0; sweep 32768 "30 32 36 40 44") &
(export CUDA_VISIBLE_DEVICES=1; sleep 5; sweep 16384 "33 56 72 80") &
wait
cat $K/walls.txt
for f in $K/b*.log; do echo "$(basename $f)"; grep -A4 "sparse.*TB/s.*dense" $f | tail -3; done
