# call 34, 5: decode at 32K, batch 16 and 34 (the most the pool holds at 0.89), dense on GPU 0 and sparse on GPU 1 at
# once, at fused_hoisted_narrow the default (call 34's pick)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k3; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call34_5.sh $K/call_command.sh
timeout -s INT 240 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k > $K/decode32k.log 2>&1; echo "decode rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/decode32k.log
tar -czf $OUT/call34_5.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
