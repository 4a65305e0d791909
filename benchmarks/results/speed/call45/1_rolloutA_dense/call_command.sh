# call 45, 1: rollout A, 64 x (1K + 16K), at main's kernels on one H200 (the only kind lent): dense, then sparse
# (bfloat16 landmarks, the default), then sparse with float8 landmarks; one detached job over calls 1 and 2
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh
K=/tmp/k451; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call45_1.sh $K/call_command.sh; cat $K/cards.txt $K/code_digest.txt
A="--decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args '--mem-fraction-static 0.89' --time-budget-s 1200"
bash $D start rolloutA "python3 benchmarks/sglang_throughput.py $A --out-dir \"\$JOB_OUT/rolloutA\" > \"\$JOB_OUT/rolloutA.log\" 2>&1; echo \"bf16 rc \$?\"; SPARROW_LANDMARK_DTYPE=float8_e4m3fn python3 benchmarks/sglang_throughput.py $A --backends sparrow --port 30200 --out-dir \"\$JOB_OUT/rolloutA_fp8\" > \"\$JOB_OUT/rolloutA_fp8.log\" 2>&1; echo \"fp8 rc \$?\""
echo "started $(( $(date +%s) - T0 )) s"; bash $D wait rolloutA $(( 575 - ($(date +%s) - T0) )); tail -4 /tmp/detached/rolloutA/out/rolloutA.log
tar -czf $OUT/call45_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
