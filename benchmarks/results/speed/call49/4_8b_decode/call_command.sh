#!/bin/bash
# call 49, 4 (call 3's host): Qwen3-8B served decode at the code of call 3 (a GQA group of 4: the server selects with
# fused_pages_narrow by default), the dense server on GPU 0 and the sparse one on GPU 1 at once, each its own port:
# 48 requests at 8K and 32 at 16K
set -u
T0=$(date +%s); K=/tmp/k494; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
W=(--sizes qwen3-8b --decode 8192x48,16384x32 --rollout-gen 0 --server-args "--mem-fraction-static 0.89")
CUDA_VISIBLE_DEVICES=0 timeout -s INT 250 python3 benchmarks/sglang_throughput.py --port 30100 --backends flashinfer \
  "${W[@]}" --out-dir $K/dense > $K/dense.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout -s INT 250 python3 benchmarks/sglang_throughput.py --port 30200 --backends sparrow \
  "${W[@]}" --out-dir $K/sparse > $K/sparse.log 2>&1 &
wait; echo "both $(( $(date +%s) - T0 )) s" >> $K/walls.txt
grep -h "decode_ctx\|healthy" $K/sparse.log $K/dense.log; cat $K/walls.txt
tar -czf $OUT/call49_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
