# call 45, 4 (call 3's host, warm): the sparse half of rollout A with float8 landmarks, beside call 3's bfloat16 one
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k454; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call45_4.sh $K/call_command.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 250 > $K/smi.csv 2>&1 & SMI=$!
SPARROW_LANDMARK_DTYPE=float8_e4m3fn timeout -s INT 400 python3 benchmarks/sglang_throughput.py --backends sparrow --decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args '--mem-fraction-static 0.89' --out-dir $K/rolloutA_sparse_fp8 > $K/rolloutA_sparse_fp8.log 2>&1; echo "fp8 sparse rollout rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/rolloutA_sparse_fp8.log
kill $SMI; tar -czf $OUT/call45_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
