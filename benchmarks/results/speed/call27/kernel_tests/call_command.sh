# call 27, 3: the sparse-kernel GPU module alone (it ran out of its 540 s beside three modules on GPU 1 in call 2),
# then rollout A at the default (fused_packed_narrow) as a detached job over two calls
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0; D=benchmarks/gpu_host/detached.sh
K=/tmp/k3; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call27_3.sh $K/call_command.sh
CUDA_VISIBLE_DEVICES=1 timeout 250 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=15 tests/gpu/test_sparse_kernels.py > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/gpu_sparse_kernels.log
tar -czf $OUT/call27_3_kernel_tests.tar.gz -C $K .
bash $D start rolloutA "python3 benchmarks/sglang_throughput.py --parallel-cards --decode '' --rollout-requests 64 --rollout-prompt 1024 --rollout-gen 16384 --out-dir \"\$JOB_OUT\""
bash $D wait rolloutA $(( 585 - ($(date +%s) - T0) )); bash $D collect rolloutA $OUT; echo "total $(( $(date +%s) - T0 )) s"
