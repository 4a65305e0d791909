# call 35, 4 (one H200: no 2-GPU host lent then): fused_kvstore_narrow (the selection's launch also stores the step's
# K and V): its GPU kernel tests, its two breaks, then the served selections against the oracle with it
# (SPARROW_SELECT_VARIANT=fused_kvstore_narrow), one after the other
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k354; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call35_4.sh $K/call_command.sh
echo "setup $(( $(date +%s) - T0 )) s"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "kvstore or kv_store" > $K/kt.log 2>&1; echo "kt rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/kt.log
timeout 130 python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks --only kv_store_one_head kv_store_after_landmark > $K/breaks.log 2>&1; echo "breaks rc $? $(( $(date +%s) - T0 )) s"; grep -o '"break": "[a-z_]*"\|"caught": [a-z]*' $K/breaks.log
tar -czf $OUT/call35_4a.tar.gz -C $K .
mkdir -p $K/serving; CUDA_VISIBLE_DEVICES=0 SPARROW_SELECT_VARIANT=fused_kvstore_narrow OUT=$K/serving timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sglang_serving.py -k "oracle" > $K/serving.log 2>&1; echo "serving rc $? $(( $(date +%s) - T0 )) s"; tail -2 $K/serving.log; grep -ho "selection [a-z_0-9]*,\|stored by the selection [A-Za-z]*" $K/serving/*.log | sort | uniq -c
rm -f $OUT/call35_4a.tar.gz; tar -czf $OUT/call35_4.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
