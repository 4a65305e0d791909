#!/bin/bash
# call 37, 7: the served sub-rows (SPARROW_SUB_ROWS) on GPU 0: tests/gpu/test_sub_rows.py; beside it on GPU 1 the
# break sub_rows_query_of_another_row (the module must fail on it)
K=$OUT/call37_7; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
T0=$(date +%s)
(CUDA_VISIBLE_DEVICES=0 OUT=$K/module timeout 290 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=10 \
  tests/gpu/test_sub_rows.py > $K/sub_rows.log 2>&1; echo "module exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
mkdir -p $K/module
(timeout 295 python3 benchmarks/gpu_host/breaks.py run --gpus 1 --out $K/breaks --timeout-s 280 \
  --only sub_rows_query_of_another_row > $K/breaks.log 2>&1; echo "break exit $? in $(( $(date +%s) - T0 )) s" >> $K/walls.txt) &
wait
cat $K/walls.txt; tail -n 12 $K/sub_rows.log; cat $K/breaks/breaks.jsonl 2>/dev/null | cut -c1-600
for f in $K/module/server-sub-rows-*.log; do grep -o "graph sub-rows [0-9]*" $f | head -1; grep -i -m3 "error\|Traceback" $f; done
