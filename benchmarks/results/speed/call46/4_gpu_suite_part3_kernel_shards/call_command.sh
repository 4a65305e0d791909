#!/bin/bash
# call 46, 4: the GPU suite's part 3 on one card at main's code, beside the two kernel shards that call 2's part 1
# cut at its module timeout (at_40k 37 and rest 42 tests passed, none failed, when cut)
set -u
T0=$(date +%s); K=/tmp/k464; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
(OUT=$K/suite MODULE_TIMEOUT_S=470 timeout 480 bash benchmarks/gpu_host/run_gpu_suite.sh 3 > $K/suite.log 2>&1
 echo "suite part 3 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
for s in at_40k rest; do
  [ $s = at_40k ] && e="select_pages_at_40k" || e="not (rows_past_2048 or select_pages_at_40k)"
  (timeout 480 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=10 -k "$e" tests/gpu/test_sparse_kernels.py \
     > $K/sparse_kernels-$s.log 2>&1; echo "sparse_kernels-$s rc $? $(( $(date +%s) - T0 )) s: $(tail -n 1 $K/sparse_kernels-$s.log)" >> $K/walls.txt) &
done; wait
tail -8 $K/suite.log; cat $K/walls.txt
tar -czf $OUT/call46_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
