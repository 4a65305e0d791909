# call 26, 2: the GPU suite at the code that makes fused_exit_narrow the default
T0=$(date +%s); OUT=$OUT/suite MODULE_TIMEOUT_S=540 bash benchmarks/gpu_host/run_gpu_suite.sh all; echo "suite rc $? $(( $(date +%s) - T0 )) s"; cat $OUT/suite/gpu_suite_summary.txt
