# call 34, 3: the kernel bench of fused_joint_narrow and fused_hoisted_narrow again at batch 32 and 16 (call 2 read
# hoisted 2.4 us slower at 32 x 36,864 alone, its score-only launch, which the variant barely changes, 1.6 us slower
# too): on each card, the variants in one order on GPU 0 and the other on GPU 1; the pick over each card's
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k3; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call34_3.sh $K/call_command.sh
bench() {  # GPU VARIANTS
  export CUDA_VISIBLE_DEVICES=$1
  timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants $2 --batch 32 --contexts 33024,36864 --out $K/kb_b32_gpu$1.json > $K/kb_b32_gpu$1.log 2>&1; echo "gpu $1 b32 rc $? $(( $(date +%s) - T0 )) s"
  timeout 150 python3 benchmarks/sparse_kernel_bench.py --variants $2 --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16_gpu$1.json > $K/kb_b16_gpu$1.log 2>&1; echo "gpu $1 b16 rc $? $(( $(date +%s) - T0 )) s"
}
bench 0 fused_joint_narrow,fused_hoisted_narrow &
bench 1 fused_hoisted_narrow,fused_joint_narrow &
wait
for g in 0 1; do python3 benchmarks/pick_select_variant.py $K/kb_b16_gpu$g.json $K/kb_b32_gpu$g.json > $K/pick_gpu$g.txt 2> $K/pick_gpu$g.log; echo "gpu $g pick:"; cat $K/pick_gpu$g.log $K/pick_gpu$g.txt; done
grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $K/kb_b*.log
tar -czf $OUT/call34_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
