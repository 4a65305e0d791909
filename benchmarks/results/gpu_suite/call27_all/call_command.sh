# call 27, 2: the GPU suite with fused_packed_narrow the default
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=$OUT/suite MODULE_TIMEOUT_S=540 bash benchmarks/gpu_host/run_gpu_suite.sh all; echo "suite rc $? $(( $(date +%s) - T0 )) s"
