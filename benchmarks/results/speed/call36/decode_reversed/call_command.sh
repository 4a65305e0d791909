# call 36, 4: call 1's decode pair again in the other order on the same two cards, at fused_kvstore_narrow the default:
# first SPARROW_SELECT_VARIANT=fused_qcopy_narrow (the previous default), then the default
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k364; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call36_4.sh $K/call_command.sh
SPARROW_SELECT_VARIANT=fused_qcopy_narrow timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_qcopy > $K/decode_qcopy.log 2>&1; echo "decode qcopy rc $? $(( $(date +%s) - T0 )) s"; grep "==" $K/decode_qcopy.log
tar -czf $OUT/call36_4a.tar.gz -C $K .
timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_default > $K/decode_default.log 2>&1; echo "decode default rc $? $(( $(date +%s) - T0 )) s"; grep "==" $K/decode_default.log
rm -f $OUT/call36_4a.tar.gz; tar -czf $OUT/call36_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
