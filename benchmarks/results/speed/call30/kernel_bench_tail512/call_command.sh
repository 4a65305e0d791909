# call 30, 1: fused_tail512_narrow (fused_packed_narrow whose rows of 2,049-2,304 candidates take the 2,048 + 512
# tier) against the default: its GPU kernel tests on GPU 0 beside the kernel benches at batch 16 and 34 on GPU 1, the
# pick; then, if it won, decode at 34.8K with it on the sparse server (dense on GPU 0, sparse on GPU 1 at once), else
# the GPU suite at this code (both cards)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k1; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call30_1.sh $K/call_command.sh
V=fused_packed_narrow,fused_tail512_narrow
(CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k tail512 > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"
 timeout 60 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 34 --contexts 33024,36864 --out $K/kb_b34.json > $K/kb_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json $K/kb_b34.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
for f in $K/kb_*.log; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $f; done
if [ "$(cat $K/pick.txt)" = fused_tail512_narrow ]; then
 SPARROW_SELECT_VARIANT=fused_tail512_narrow timeout -s INT 240 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 34816x16,34816x32 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode34k_tail512 > $K/decode34k_tail512.log 2>&1; echo "decode rc $? $(( $(date +%s) - T0 )) s"; tail -4 $K/decode34k_tail512.log
else
 OUT=$K/suite MODULE_TIMEOUT_S=$(( 585 - ($(date +%s) - T0) - 20 )) timeout $(( 585 - ($(date +%s) - T0) )) bash benchmarks/gpu_host/run_gpu_suite.sh all > $K/suite.log 2>&1; echo "suite rc $? $(( $(date +%s) - T0 )) s"; cat $K/suite/gpu_suite_summary.txt
fi
tar -czf $OUT/call30_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
