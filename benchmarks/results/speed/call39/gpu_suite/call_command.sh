#!/bin/bash
# call 39, 4: the whole GPU suite at the final code (make_case's interleaved placement; the served default unchanged)
set -u
T0=$(date +%s); K=$OUT/call39_4; mkdir -p $K; cp "$0" $K/call_command.sh
nvidia-smi --query-gpu=index,name,uuid --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt
OUT=$K/suite MODULE_TIMEOUT_S=530 timeout 560 bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1
echo "suite rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
cat $K/suite/gpu_suite_summary.txt; tail -5 $K/suite.log; cat $K/walls.txt
cd $OUT && tar czf call39_4.tgz call39_4 && rm -rf call39_4
