# call 33, 5: rollout A, 64 x (1K + 16K), at the new default (fused_joint_narrow), pools at --mem-fraction-static 0.89
# (the workload at once), dense on GPU 0 and sparse on GPU 1 at once
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k5; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call33_5.sh $K/call_command.sh
timeout -s INT 540 python3 benchmarks/sglang_throughput.py --parallel-cards --decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args '--mem-fraction-static 0.89' --out-dir $K/rolloutA > $K/rolloutA.log 2>&1; echo "rollout rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/rolloutA.log
tar -czf $OUT/call33_5.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
