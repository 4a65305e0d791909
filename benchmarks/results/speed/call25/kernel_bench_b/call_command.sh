# call 25, 2: the fused variants (pipelined row loop)' GPU tests and kernel benches beside the default, and the pick
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k2; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call25_2.sh $K/call_command.sh
V=short8_hist40_wide,fused_hist64,fused_hist64_wide
(export CUDA_VISIBLE_DEVICES=0; timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "fused or one_launch" > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 16384,32768,33024,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1; python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 64 --contexts 8448,12288,16384,24576 --out $K/kb_b64.json > $K/kb_b64.log 2>&1; echo "b64 rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --group 4 --batch 48 --contexts 12288,16384 --schedule qwen3-4b-0.86 --out $K/kb_g4.json > $K/kb_g4.log 2>&1; echo "g4 rc $? $(( $(date +%s) - T0 )) s"
 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 40 --contexts 16384,24576,32768 --out $K/kb_b40.json > $K/kb_b40.log 2>&1; echo "b40 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b64.json $K/kb_b16.json $K/kb_b40.json $K/kb_g4.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -5 $K/gpu_sparse_kernels.log
for f in $K/kb_*.log; do echo "== $f"; grep -E "^ +[0-9]+ +40960 +[0-9]+ " $f; done
tar -czf $OUT/call25_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
