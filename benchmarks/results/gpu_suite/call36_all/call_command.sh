# call 36, 2: the GPU suite at fused_kvstore_narrow the default (every module: the kernel tests of every variant, the
# served selections against the oracle, the serving tests)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k362; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call36_2.sh $K/call_command.sh
OUT_FINAL=$OUT; OUT=$K/suite MODULE_TIMEOUT_S=540 timeout 570 bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1; echo "suite rc $? $(( $(date +%s) - T0 )) s"; tail -n 15 $K/suite.log
tar -czf $OUT_FINAL/call36_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
