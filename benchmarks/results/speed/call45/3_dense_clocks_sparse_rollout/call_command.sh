# call 45, 3 (a fresh host: call 2 found call 1's host given back, its rollout job gone after the dense half):
# the dense decode graph at 32K x 16 timed by CUDA events over 3,000 steps beside the card's clocks and power
# (nvidia-smi every 250 ms), then the sparse half of rollout A (bfloat16 landmarks) alone
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k453; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call45_3.sh $K/call_command.sh; cat $K/cards.txt $K/code_digest.txt
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory
for R in clocks_event_reasons.active clocks_throttle_reasons.active; do nvidia-smi --query-gpu=$Q,$R --format=csv -c 1 >/dev/null 2>&1 && { Q=$Q,$R; break; }; done
nvidia-smi --query-gpu=$Q --format=csv -lms 250 > $K/smi.csv 2>&1 & SMI=$!
timeout -s INT 240 python3 benchmarks/replay_timing.py --backends flashinfer --gen-len 3000 --context 32768 --batch 16 --server-args "--mem-fraction-static 0.89" --out-dir $K/replay_timing_dense > $K/replay_timing_dense.log 2>&1; echo "dense replay timing rc $? $(( $(date +%s) - T0 )) s"; tail -16 $K/replay_timing_dense.log
timeout -s INT $(( 580 - ($(date +%s) - T0) )) python3 benchmarks/sglang_throughput.py --backends sparrow --decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --server-args '--mem-fraction-static 0.89' --out-dir $K/rolloutA_sparse > $K/rolloutA_sparse.log 2>&1; echo "sparse rollout rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/rolloutA_sparse.log
kill $SMI; rm -f $K/replay_timing_dense/server-profile-*.log.gz; tar -czf $OUT/call45_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
