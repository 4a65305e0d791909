# call 36, 5 (the session's last device seconds): the sparse decode's FlashInfer kernel and KV split in the kernel
# bench (sparse_kernel_bench.py --kernels), batch 16 on GPU 0 beside batch 34 on GPU 1, default selection
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=$OUT/k365; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call36_5.sh $K/call_command.sh
KS="cuda-cores,tensor-cores,tensor-cores:nosplit,tensor-cores:split=16,tensor-cores:split=32,tensor-cores:split=64,tensor-cores:split=128"
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow --batch 16 --contexts 32768,33024 --kernels $KS --out $K/split_b16.json > $K/split_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s") &
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow --batch 34 --contexts 32768 --kernels $KS --out $K/split_b34.json > $K/split_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s") &
wait; tail -n 18 $K/split_b16.log; tail -n 9 $K/split_b34.log; echo "total $(( $(date +%s) - T0 )) s"
