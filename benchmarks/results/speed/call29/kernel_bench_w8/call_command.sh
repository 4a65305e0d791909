# call 29, 1: fused_packed_w8_narrow (the fused launch at 8 warps under 128 registers) against the default
# (fused_packed_narrow): its GPU kernel tests on GPU 0 beside the kernel benches at batch 16 and 34 on GPU 1, the pick,
# then, only if it wins, decode at 32K with it on the sparse server (dense on GPU 0, sparse on GPU 1 at once)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k1; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call29_1.sh $K/call_command.sh
V=fused_packed_narrow,fused_packed_w8_narrow
(CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k w8 > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 16384,32768,33024,34816,36864,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"
 timeout 60 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 34 --contexts 32768 --out $K/kb_b34.json > $K/kb_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json $K/kb_b34.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
for f in $K/kb_*.log; do echo "== $f"; grep -E "^ +[0-9]+ +(32768|33024|40960) +[0-9]+ " $f; done
if [ "$(cat $K/pick.txt)" = fused_packed_w8_narrow ]; then
 SPARROW_SELECT_VARIANT=fused_packed_w8_narrow timeout -s INT 240 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k_w8 > $K/decode32k_w8.log 2>&1; echo "decode rc $? $(( $(date +%s) - T0 )) s"; tail -4 $K/decode32k_w8.log
fi
tar -czf $OUT/call29_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
