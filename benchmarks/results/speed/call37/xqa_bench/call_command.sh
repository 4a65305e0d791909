#!/bin/bash
# call 37, 1: FlashInfer's XQA kernel for the sparse decode against the default (CUDA cores, FlashInfer's split)
K=$OUT/call37_1; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; (which nvcc; nvcc --version | tail -2) >> $K/cards.txt 2>&1
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
B=benchmarks/sparse_kernel_bench.py; V="--variants fused_kvstore_narrow"
(export CUDA_VISIBLE_DEVICES=0; T0=$(date +%s)
 timeout 260 python3 $B $V --batch 16 --contexts 32768,33024 \
   --kernels cuda-cores,xqa,xqa:split=2,xqa:split=4,xqa:split=8,xqa:split=16 --out $K/xqa_b16.json > $K/xqa_b16.log 2>&1
 echo "b16 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; T0=$(date +%s)
 timeout 200 python3 $B $V --group 4 --batch 48 --contexts 16384 \
   --kernels tensor-cores,xqa,xqa:split=2,xqa:split=4,xqa:split=8 --out $K/xqa_g4_b48.json > $K/xqa_g4_b48.log 2>&1
 echo "g4 b48 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
(export CUDA_VISIBLE_DEVICES=1; sleep 20; T0=$(date +%s)
 timeout 260 python3 $B $V --batch 34 --contexts 32768 \
   --kernels cuda-cores,tensor-cores:split=32,xqa,xqa:split=2,xqa:split=4,xqa:split=8 --out $K/xqa_b34.json > $K/xqa_b34.log 2>&1
 echo "b34 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; T0=$(date +%s)
 timeout 180 python3 $B $V --batch 64 --contexts 16384 \
   --kernels cuda-cores,xqa,xqa:split=2,xqa:split=4 --out $K/xqa_b64.json > $K/xqa_b64.log 2>&1
 echo "b64 exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
wait
ls -la $K; cat $K/walls.txt; tail -12 $K/xqa_b16.log $K/xqa_b34.log $K/xqa_b64.log $K/xqa_g4_b48.log
