#!/bin/bash
# call 38, 6: the kernel bench with FlashInfer's sparse decode planned as under a CUDA graph (--plan graph, GPU 0)
# beside the eager plan it used before (GPU 1), CUDA cores and 2 sub-rows, at 32 x 32K, 40 x 32K and 64 x 16K
set -u
T0=$(date +%s); K=$OUT/call38_6; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid --format=csv > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt
bench() {  # card plan
  for b in "32 32768" "40 32768" "64 16384"; do set -- $1 $2 $b
    CUDA_VISIBLE_DEVICES=$1 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow \
      --kernels cuda-cores,tensor-cores:parts=2 --plan $2 --batch $3 --contexts $4 --out $K/kb_$2_b$3.json \
      > $K/kb_$2_b$3.log 2>&1; echo "$2 b$3 card $1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  done
}
bench 0 graph & bench 1 eager & wait
for f in $K/kb_*.log; do echo "== $f"; tail -3 $f; done; cat $K/walls.txt
cd $OUT && tar czf call38_6.tgz call38_6 && rm -rf call38_6
