#!/bin/bash
# call 37, 2: the sparse decode's kernel at large batches on a second host: CUDA cores (FlashInfer's split), tensor
# cores at a fixed split, XQA (one CTA a row)
K=$OUT/call37_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
B=benchmarks/sparse_kernel_bench.py; V="--variants fused_kvstore_narrow"
KS=cuda-cores,tensor-cores:split=16,tensor-cores:split=32,tensor-cores:split=64,xqa
(export CUDA_VISIBLE_DEVICES=0; for b in 16 24 28 34; do T0=$(date +%s)
 timeout 100 python3 $B $V --batch $b --contexts 32768 --kernels $KS --out $K/b${b}_32k.json > $K/b${b}_32k.log 2>&1
 echo "b$b 32K exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done) &
(export CUDA_VISIBLE_DEVICES=1; sleep 15; for b in 32 48 64; do T0=$(date +%s)
 timeout 100 python3 $B $V --batch $b --contexts 16384 --kernels $KS --out $K/b${b}_16k.json > $K/b${b}_16k.log 2>&1
 echo "b$b 16K exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt; done) &
wait
cat $K/walls.txt
