# call 35, 5 (one H200, right after call 4): decode at 32K, batch 16 and 34, of the sparse server alone with
# fused_kvstore_narrow and with the default (fused_qcopy_narrow), one after the other on the same card
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k355; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call35_5.sh $K/call_command.sh
for v in fused_kvstore_narrow fused_qcopy_narrow; do SPARROW_SELECT_VARIANT=$v timeout -s INT 260 python3 benchmarks/sglang_throughput.py --backends sparrow --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode_$v > $K/decode_$v.log 2>&1; echo "decode $v rc $? $(( $(date +%s) - T0 )) s"; grep "==" $K/decode_$v.log; tar -czf $OUT/call35_5.tar.gz -C $K .; done
echo "total $(( $(date +%s) - T0 )) s"
