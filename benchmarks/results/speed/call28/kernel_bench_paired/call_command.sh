# call 28, 6: fused_paired_narrow (two programs score each row at one row per SM or fewer): its GPU kernel tests on
# GPU 0 beside its kernel bench at batch 16 (128 rows: paired) against the default on GPU 1
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
K=/tmp/k6; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call28_6.sh $K/call_command.sh
(CUDA_VISIBLE_DEVICES=0 timeout 140 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k paired > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s") &
(CUDA_VISIBLE_DEVICES=1 timeout 140 python3 benchmarks/sparse_kernel_bench.py --variants fused_packed_narrow,fused_paired_narrow --batch 16 --contexts 16384,32768,33024,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s") &
wait; tail -4 $K/gpu_sparse_kernels.log; grep -E "^ +[0-9]+ +40960 +" $K/kb_b16.log
tar -czf $OUT/call28_6.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
