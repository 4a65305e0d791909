# call 45, 2: the end of call 1's rollout job, then decode graph replays at 32K x 16 timed by CUDA events, profiled
# and not, dense and sparse one after the other (benchmarks/replay_timing.py)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh
K=/tmp/k452; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call45_2.sh $K/call_command.sh
bash $D wait rolloutA 330; bash $D collect rolloutA $OUT; echo "job $(( $(date +%s) - T0 )) s"
timeout -s INT $(( 585 - ($(date +%s) - T0) )) python3 benchmarks/replay_timing.py --context 32768 --batch 16 --server-args "--mem-fraction-static 0.89" --out-dir $K/replay_timing > $K/replay_timing.log 2>&1; echo "replay timing rc $? $(( $(date +%s) - T0 )) s"; tail -22 $K/replay_timing.log
rm -f $K/replay_timing/server-profile-*.log.gz; tar -czf $OUT/call45_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
