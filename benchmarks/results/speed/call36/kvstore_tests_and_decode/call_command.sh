# call 36, 1: the GPU kernel tests of the query copy and the K/V store (their shared case helper, refactored after
# call 35) on GPU 0; then decode at 32K, batch 16 and 34, dense on GPU 0 and sparse on GPU 1 at once, with
# fused_kvstore_narrow and with the default (fused_qcopy_narrow), one after the other on the same two cards
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k361; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call36_1.sh $K/call_command.sh
echo "setup $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "qcopy or query_copy or kvstore or kv_store" > $K/kt.log 2>&1; echo "kt rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/kt.log
SPARROW_SELECT_VARIANT=fused_kvstore_narrow timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_kvstore > $K/decode_kvstore.log 2>&1; echo "decode kvstore rc $? $(( $(date +%s) - T0 )) s"; grep "==" $K/decode_kvstore.log
tar -czf $OUT/call36_1a.tar.gz -C $K .
timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_default > $K/decode_default.log 2>&1; echo "decode default rc $? $(( $(date +%s) - T0 )) s"; grep "==" $K/decode_default.log
rm -f $OUT/call36_1a.tar.gz; tar -czf $OUT/call36_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
