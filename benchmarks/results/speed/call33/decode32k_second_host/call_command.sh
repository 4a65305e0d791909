# call 33, 6 (another host): decode at 32K, batch 16 and 34, dense on GPU 0 and sparse on GPU 1 at once, at the new
# default fused_joint_narrow (call 3's command); then the kernel bench of the default at batch 16 on GPU 1
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k6; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call33_6.sh $K/call_command.sh
timeout -s INT 200 python3 benchmarks/sglang_throughput.py --parallel-cards --decode 32768x16,32768x34 --rollout-gen 0 --server-args "--mem-fraction-static 0.89" --out-dir $K/decode32k > $K/decode32k.log 2>&1; echo "decode rc $? $(( $(date +%s) - T0 )) s"; tail -3 $K/decode32k.log
CUDA_VISIBLE_DEVICES=1 timeout 80 python3 benchmarks/sparse_kernel_bench.py --variants fused_joint_narrow --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"; grep -E "^ +[0-9]+ +[0-9]+ " $K/kb_b16.log
tar -czf $OUT/call33_6.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
