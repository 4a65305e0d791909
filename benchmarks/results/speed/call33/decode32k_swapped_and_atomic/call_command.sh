# call 33, 4: call 3's decode (32K, batch 16 and 34) on the same host with the cards swapped (dense on GPU 1, sparse
# on GPU 0: CUDA_VISIBLE_DEVICES=1,0), then both halves again at the cards of call 3 with the old default
# (SPARROW_SELECT_VARIANT=fused_atomic_narrow; the dense server ignores it)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k4; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call33_4.sh $K/call_command.sh
CUDA_VISIBLE_DEVICES=1,0 timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k_swapped > $K/decode32k_swapped.log 2>&1; echo "swapped rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/decode32k_swapped.log
SPARROW_SELECT_VARIANT=fused_atomic_narrow timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k_atomic > $K/decode32k_atomic.log 2>&1; echo "atomic rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/decode32k_atomic.log
tar -czf $OUT/call33_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
