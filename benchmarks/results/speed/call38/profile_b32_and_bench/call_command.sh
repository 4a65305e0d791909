#!/bin/bash
# call 38, 5: the served CUDA-core split against the kernel bench's at 32 x 32K on one host: a per-layer profile of one
# decode graph replay of the sparse server (GPU 0) beside sparse_kernel_bench.py at the same shape (GPU 1)
set -u
T0=$(date +%s); K=$OUT/call38_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid --format=csv > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt
(CUDA_VISIBLE_DEVICES=0 timeout -s INT 200 python3 benchmarks/decode_profile.py --context 32768 --batch 32 \
  --backends sparrow --server-args "--mem-fraction-static 0.89" --port 0 --out-dir $K/profile_32k_b32_default \
  > $K/profile_32k_b32_default.log 2>&1; echo "profile rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow \
  --kernels cuda-cores,tensor-cores:parts=2 --batch 32 --contexts 32768 --out $K/kernel_bench_b32.json \
  > $K/kernel_bench_b32.log 2>&1; echo "bench rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
wait
head -8 $K/profile_32k_b32_default.log; tail -12 $K/kernel_bench_b32.log; cat $K/walls.txt
cd $OUT && tar czf call38_5.tgz call38_5 && rm -rf call38_5
