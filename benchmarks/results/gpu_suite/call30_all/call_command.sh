# call 30, 1 (benchmarks/results/speed/call30/kernel_bench_tail512/call_command.sh): fused_tail512_narrow lost the pick,
# so the same call ran the suite on both cards of the 2 x H200 host at this code (digest b7d987bfdc829f90):
OUT=$K/suite MODULE_TIMEOUT_S=$(( 585 - ($(date +%s) - T0) - 20 )) timeout $(( 585 - ($(date +%s) - T0) )) bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1
