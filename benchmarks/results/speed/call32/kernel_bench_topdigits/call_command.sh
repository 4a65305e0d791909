# call 32, 6: fused_topdigits_narrow (the first round by a 32-bin histogram of each key's distance in digits below the
# row's highest key, the rounds after it by atomics) against the default -- its GPU kernel tests then the phase profile
# of both on GPU 0, beside the kernel bench at batch 16 on GPU 1; the pick
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k6; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call32_6.sh $K/call_command.sh
V=fused_atomic_narrow,fused_topdigits_narrow
(export CUDA_VISIBLE_DEVICES=0
 timeout 100 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "topdigits and (one_launch or rows_past_2048)" > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"
 timeout 60 python3 benchmarks/selection_phase_profile.py --batch 16 --contexts 33024 --variants $V --out $K/phases_b16.json > $K/phases_b16.log 2>&1; echo "phases rc $? $(( $(date +%s) - T0 )) s") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 150 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $K/kb_b16.log
tail -4 $K/phases_b16.log
tar -czf $OUT/call32_6.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
