#!/bin/bash
# call 37, 5: the GPU kernel module at the session's final product code (SparseLayer's attend restructured for sub-rows)
K=$OUT/call37_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
T0=$(date +%s); CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m pytest -q -p no:cacheprovider -rfEs \
  tests/gpu/test_sparse_kernels.py -k "not query_copy and not kv_store" > $K/kernels_a.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py \
  -k "query_copy or kv_store" > $K/kernels_b.log 2>&1; wait
echo "wall $(( $(date +%s) - T0 )) s" > $K/walls.txt; tail -2 $K/kernels_a.log $K/kernels_b.log
