# call 35, 2: the GPU suite at the final code (fused_qcopy_narrow the default)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k352; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call35_2.sh $K/call_command.sh
echo "setup $(( $(date +%s) - T0 )) s"
OUT=$K/suite MODULE_TIMEOUT_S=540 timeout -s INT 570 bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1; echo "suite rc $? $(( $(date +%s) - T0 )) s"; tail -25 $K/suite.log
tar -czf $OUT/call35_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
