# call 28, 1: the row-loop variants (fused_packed_s4_narrow, fused_packed_b64s6_narrow) beside the default
# (fused_packed_narrow): their GPU kernel tests, kernel benches at batch 16, 34, 64 and group 4, the pick; then
# decode at 32K with the winner (dense GPU 0, sparse GPU 1 at once) if one beats the default, else the GPU break of
# the packed round on GPU 1 beside the kernel module's two halves on GPU 0
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k1; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call28_1.sh $K/call_command.sh
V=fused_packed_narrow,fused_packed_s4_narrow,fused_packed_b64s6_narrow
(export CUDA_VISIBLE_DEVICES=0; timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "s4_narrow or b64s6" > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 16384,32768,33024,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 34 --contexts 32768 --out $K/kb_b34.json > $K/kb_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1; python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 64 --contexts 8448,16384,24576 --out $K/kb_b64.json > $K/kb_b64.log 2>&1; echo "b64 rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --group 4 --batch 48 --contexts 16384 --schedule qwen3-4b-0.86 --out $K/kb_g4.json > $K/kb_g4.log 2>&1; echo "g4 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json $K/kb_b64.json $K/kb_g4.json $K/kb_b34.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
for f in $K/kb_*.log; do echo "== $f"; cat $f | tail -25; done
W=$(cat $K/pick.txt)
if [ -n "$W" ] && [ "$W" != fused_packed_narrow ]; then
 SPARROW_SELECT_VARIANT=$W timeout -s INT 240 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k_$W > $K/decode32k.log 2>&1; echo "decode $W rc $? $(( $(date +%s) - T0 )) s"; tail -4 $K/decode32k.log
else
 (BREAK_GPUS=1 BREAKS_ONLY="radix_packed_keys_above_halved" OUT=$K bash benchmarks/gpu_host/run_gpu_suite.sh breaks > $K/breaks_suite.log 2>&1; echo "break rc $? $(( $(date +%s) - T0 )) s") &
 (H=$K/halves; mkdir -p $H; for e in "rows_past_2048" "not (rows_past_2048)"; do CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs -k "$e" tests/gpu/test_sparse_kernels.py; done > $H/halves.log 2>&1; echo "halves rc $? $(( $(date +%s) - T0 )) s") &
 wait; tail -3 $K/halves/halves.log; cat /tmp/gpu-suite-breaks-gpu1/summary.txt $K/breaks-gpu1.jsonl 2>/dev/null; cp -r /tmp/gpu-suite-breaks-gpu1 $K/breaks_work 2>/dev/null
fi
tar -czf $OUT/call28_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
