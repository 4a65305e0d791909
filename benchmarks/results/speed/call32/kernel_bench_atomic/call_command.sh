# call 32, 1: fused_atomic_narrow / fused_atomic_all_narrow (the histogram rounds after the first / every round by one
# global atomic a live key, not Triton 3.6's ballot histogram) against the default -- their GPU kernel tests then the
# phase profile of the three on GPU 0, beside the kernel benches at batch 16, 34 and 64 on GPU 1; the pick
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k1; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call32_1.sh $K/call_command.sh
python3 -c "import triton; print('triton', triton.__version__)" > $K/triton.txt
V=fused_rolled_narrow,fused_atomic_narrow,fused_atomic_all_narrow
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k atomic > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"
 timeout 200 python3 benchmarks/selection_phase_profile.py --batch 16 --contexts 32768,33024,34816 --variants $V --out $K/phases_b16.json > $K/phases_b16.log 2>&1; echo "phases rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 200 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"
 timeout 120 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 34 --contexts 33024,36864 --out $K/kb_b34.json > $K/kb_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s"
 timeout 120 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 64 --contexts 16384,17408 --out $K/kb_b64.json > $K/kb_b64.log 2>&1; echo "b64 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json $K/kb_b34.json $K/kb_b64.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
for f in $K/kb_*.log; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $f; done
tail -12 $K/phases_b16.log
tar -czf $OUT/call32_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
