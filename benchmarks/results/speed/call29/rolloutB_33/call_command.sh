# call 29, 3 and 4 (back to back after call 2 on the same warm 2 x H200 host; code d756954, digest 4af4c0486f5f29ad):
# rollout B, 33 x (1K + 32K), at the default, dense on GPU 0 and sparse on GPU 1 at once, a detached job over two calls
# 3:
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh; nvidia-smi -L; bash benchmarks/gpu_host/run_gpu_suite.sh digest; bash $D start rolloutB_33 "python3 benchmarks/sglang_throughput.py --parallel-cards --decode '' --rollout-requests 33 --rollout-prompt 1024 --rollout-gen 32768 --server-args '--mem-fraction-static 0.89' --out-dir \"\$JOB_OUT\""; bash $D wait rolloutB_33 $(( 580 - ($(date +%s) - T0) )); bash $D collect rolloutB_33 $OUT; echo "total $(( $(date +%s) - T0 )) s"
# 4:
T0=$(date +%s); D=benchmarks/gpu_host/detached.sh; bash $D wait rolloutB_33 300; bash $D collect rolloutB_33 $OUT; echo "total $(( $(date +%s) - T0 )) s"
