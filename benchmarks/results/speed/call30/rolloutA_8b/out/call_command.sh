# call 30, Qwen3-8B rollout A, 64 x (1K + 16K), at the default, dense on GPU 0 and sparse on GPU 1 at once, a detached
# job over two calls (the first starts it and waits; the second: `bash $D wait rolloutA_8b 300; bash $D collect ...`)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh; nvidia-smi -L; bash benchmarks/gpu_host/run_gpu_suite.sh digest
bash $D start rolloutA_8b 'cp call30_8b.sh "$JOB_OUT/call_command.sh"; python3 benchmarks/sglang_throughput.py --sizes qwen3-8b --parallel-cards --decode "" --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args "--mem-fraction-static 0.89" --out-dir "$JOB_OUT"'
bash $D wait rolloutA_8b $(( 580 - ($(date +%s) - T0) )); bash $D collect rolloutA_8b $OUT; echo "total $(( $(date +%s) - T0 )) s"
# the second call (back to back on the same warm host):
T0=$(date +%s); D=benchmarks/gpu_host/detached.sh; bash $D wait rolloutA_8b 300; bash $D collect rolloutA_8b $OUT; echo "total $(( $(date +%s) - T0 )) s"
