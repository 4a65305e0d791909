# call 30, 5: the top-k's cost against the budget: fused_packed_narrow at batch 16 with fixed budgets of 128, 256 and
# 512 pages (128 on GPU 0 beside 256 on GPU 1, then 512 on GPU 0), at 32K, 33K, 34.8K, 37.1K and 40K
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site PYTHONUNBUFFERED=1
K=/tmp/k5; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call30_kb_k.sh $K/call_command.sh
kb() { CUDA_VISIBLE_DEVICES=$1 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants fused_packed_narrow --batch 16 --budget-pages $2 --contexts 32768,33024,34816,37120,40960 --out $K/kb_budget$2.json > $K/kb_budget$2.log 2>&1; echo "budget $2 rc $? $(( $(date +%s) - T0 )) s"; }
kb 0 128 & kb 1 256 & wait; kb 0 512
for f in $K/kb_budget*.log; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $f; done
tar -czf $OUT/call30_5.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
