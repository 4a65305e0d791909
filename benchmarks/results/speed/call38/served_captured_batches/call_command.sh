#!/bin/bash
# call 38, 4: served sparse decode at batches SGLang captures exactly (32 x 32K, 48 and 56 x 16K), where the kernel
# bench put the CUDA-core split at its worst (call 37): FlashInfer's split (GPU 0) against 2 sub-rows (GPU 1) at once
set -u
K=$OUT/call38_4; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
run() {  # card sub-rows name port
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SUB_ROWS=$2 timeout 250 python3 benchmarks/sglang_throughput.py \
    --decode 32768x32,16384x56,16384x48 --rollout-gen 0 --backends sparrow --server-args "--mem-fraction-static 0.89" \
    --port $4 --out-dir $K/$3 > $K/$3.log 2>&1
  echo "$3 card $1 SPARROW_SUB_ROWS=$2 rc $? wall $(( $(date +%s) - t0 )) s" >> $K/walls.txt
}
run 0 1 gpu0_default 30100 &
run 1 2 gpu1_sub_rows2 30200 &
wait
grep -h "^== \|healthy\|ERROR" $K/*.log | cut -c1-300
cat $K/walls.txt
cd $OUT && tar czf call38_4.tgz call38_4 && rm -rf call38_4
