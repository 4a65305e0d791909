#!/bin/bash
# call 49, 5 (call 4's host, warm): call 4 with both cards sparse: GPU 0 with SPARROW_SELECT_VARIANT=fused_kvstore_narrow,
# GPU 1 with the group-4 default (fused_pages_narrow, as in call 4 on that card), at once
set -u
T0=$(date +%s); K=/tmp/k495; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
W=(--sizes qwen3-8b --decode 8192x48,16384x32 --rollout-gen 0 --server-args "--mem-fraction-static 0.89")
CUDA_VISIBLE_DEVICES=0 SPARROW_SELECT_VARIANT=fused_kvstore_narrow timeout -s INT 140 python3 benchmarks/sglang_throughput.py --port 30100 --backends sparrow \
  "${W[@]}" --out-dir $K/sparse_kvstore > $K/sparse_kvstore.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout -s INT 140 python3 benchmarks/sglang_throughput.py --port 30200 --backends sparrow \
  "${W[@]}" --out-dir $K/sparse > $K/sparse.log 2>&1 &
wait; echo "both $(( $(date +%s) - T0 )) s" >> $K/walls.txt
grep -h "decode_ctx\|healthy" $K/sparse.log $K/sparse_kvstore.log; cat $K/walls.txt
tar -czf $OUT/call49_5.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
