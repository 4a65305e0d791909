# call 28, 2: rollout A, 64 x (1K + 16K), at the default (fused_packed_narrow), pool at --mem-fraction-static 0.89 (the
# workload held at once), dense on GPU 0 and sparse on GPU 1 at once, as a detached job
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh
K=/tmp/k2; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call28_2.sh $K/call_command.sh
bash $D start rolloutA "python3 benchmarks/sglang_throughput.py --parallel-cards --decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args '--mem-fraction-static 0.89' --out-dir \"\$JOB_OUT\""
bash $D wait rolloutA 545; bash $D collect rolloutA $K
tar -czf $OUT/call28_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
