# call 34, 4: the GPU suite (both cards) at fused_hoisted_narrow the default, the pick of
# call 34's calls 2 and 3
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k2; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call34_4.sh $K/call_command.sh
OUT=$K/suite MODULE_TIMEOUT_S=$(( 585 - ($(date +%s) - T0) - 20 )) timeout $(( 585 - ($(date +%s) - T0) )) bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1; echo "suite rc $? $(( $(date +%s) - T0 )) s"; cat $K/suite/gpu_suite_summary.txt
tar -czf $OUT/call34_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
