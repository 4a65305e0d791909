#!/bin/bash
# call 38, 2: per-layer profiles of one decode graph replay at 32K x 34, the sparse server at FlashInfer's CUDA-core
# split (GPU 0) beside the same server with 2 sub-rows (GPU 1): where call 38, 1's served loss of 2 sub-rows comes from
set -u
T0=$(date +%s); K=$OUT/call38_2; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid --format=csv > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt
prof() {  # card sub-rows name
  CUDA_VISIBLE_DEVICES=$1 SPARROW_SUB_ROWS=$2 timeout -s INT 230 python3 benchmarks/decode_profile.py --context 32768 \
    --batch 34 --backends sparrow --server-args "--mem-fraction-static 0.89" --port 0 --out-dir $K/$3 > $K/$3.log 2>&1
  echo "$3 card $1 SPARROW_SUB_ROWS=$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
prof 0 1 profile_32k_b34_default & prof 1 2 profile_32k_b34_sub_rows2 & wait
tail -25 $K/profile_32k_b34_default.log; tail -25 $K/profile_32k_b34_sub_rows2.log; cat $K/walls.txt
cd $OUT && tar czf call38_2.tgz call38_2 && rm -rf call38_2
