#!/bin/bash
# call 49, 2 (a 2 x H200 host): Qwen3-4B served decode at rollout A's contexts (48 requests at 8K and at 16K), the
# sparse server on GPU 0 with SPARROW_SELECT_VARIANT=fused_pages_narrow, then with the default fused_kvstore_narrow
# (the same command on the same card, back to back), the dense server on GPU 1 beside them (the same workloads)
set -u
T0=$(date +%s); K=/tmp/k492; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
W=(--sizes qwen3-4b --decode 8192x48,16384x48 --rollout-gen 0 --server-args "--mem-fraction-static 0.89")
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  for V in fused_pages_narrow fused_kvstore_narrow; do
    SPARROW_SELECT_VARIANT=$V timeout -s INT $(( 575 - ($(date +%s) - T0) )) python3 benchmarks/sglang_throughput.py \
      --backends sparrow "${W[@]}" --out-dir $K/sparse_$V > $K/sparse_$V.log 2>&1
    echo "gpu0 sparse $V rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  done
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout -s INT 400 python3 benchmarks/sglang_throughput.py --backends flashinfer "${W[@]}" --out-dir $K/dense > $K/dense.log 2>&1
  echo "gpu1 dense rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv -lms 1000 > $K/smi.csv 2>&1 & SMI=$!
gpu0 & P0=$!; gpu1 & P1=$!; wait $P0 $P1
kill $SMI
grep -h "decode_ctx" $K/sparse_*.log $K/dense.log; cat $K/walls.txt
tar -czf $OUT/call49_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
