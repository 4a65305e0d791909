#!/bin/bash
# call 46, 1: decode at 32K x 16 and x 34 on one H200, the dense server then the sparse one back to back, at main's
# code (the query copied at every batch size); both servers on a Triton cache of their own, empty at the start, so
# the sparse server's graph capture shows every compile pause of main's kernels (benchmarks/capture_times.py)
set -u
T0=$(date +%s); K=/tmp/k461; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
export TRITON_CACHE_DIR=$K/triton
timeout -s INT 540 python3 benchmarks/sglang_throughput.py --decode 32768x16,32768x34 --rollout-gen 0 \
   --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k > $K/decode32k.log 2>&1
echo "decode32k rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
ls -R --full-time $K/triton > $K/triton_listing.txt; rm -rf $K/triton
python3 benchmarks/capture_times.py $K/decode32k/server-*.log > $K/capture_times.txt 2>&1
tail -12 $K/decode32k.log; cat $K/capture_times.txt $K/walls.txt
tar -czf $OUT/call46_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
