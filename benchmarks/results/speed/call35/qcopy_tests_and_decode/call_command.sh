# call 35, 1: fused_qcopy_narrow (the query copy in the fused launch and, past its fused rows, in the split scoring):
# its GPU kernel tests (fused and split) on GPU 0 beside its two breaks on GPU 1; then decode at 32K, batch 16 and 34,
# dense on GPU 0 and sparse on GPU 1 at once, with fused_qcopy_narrow and with the default (fused_hoisted_narrow)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k351; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call35_1.sh $K/call_command.sh
echo "setup $(( $(date +%s) - T0 )) s"
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "qcopy or query_copy" > $K/kt.log 2>&1; echo "kt rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/kt.log) &
(timeout 170 python3 benchmarks/gpu_host/breaks.py run --gpus 1 --out $K/breaks --only query_copy_one_head query_copy_split_one_head > $K/breaks.log 2>&1; echo "breaks rc $? $(( $(date +%s) - T0 )) s"; tail -4 $K/breaks.log) &
wait
SPARROW_SELECT_VARIANT=fused_qcopy_narrow timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_qcopy > $K/decode_qcopy.log 2>&1; echo "decode qcopy rc $? $(( $(date +%s) - T0 )) s"; tail -2 $K/decode_qcopy.log
tar -czf $OUT/call35_1a.tar.gz -C $K .
timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_default > $K/decode_default.log 2>&1; echo "decode default rc $? $(( $(date +%s) - T0 )) s"; tail -2 $K/decode_default.log
rm -f $OUT/call35_1a.tar.gz; tar -czf $OUT/call35_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
