# call 32, 5: the GPU kernel tests of fused_atomic_narrow (the default) on deliberate breaks of its atomic rounds, each
# in its own copy of the tree: its rounds sharing one set of bins (breaks.py's atomic_rounds_share_bins) and its bins
# read with the zeros that L1 may hold (no .cg) on GPU 0, one after the other; its bins read without the block barrier
# after the atomics on GPU 1
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k5; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call32_5.sh $K/call_command.sh
brk() {  # NAME GPU FILE OLD NEW (OLD, NEW: Python string literals)
  local d=/tmp/brk-$1; rm -rf $d; mkdir -p $d
  tar --exclude=./.whl --exclude=./.whl-dl --exclude=./.kit --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -xf - -C $d
  python3 -c "import ast, sys; p, old, new = sys.argv[1], ast.literal_eval(sys.argv[2]), ast.literal_eval(sys.argv[3]); s = open(p).read(); assert s.count(old) == 1, old; open(p, 'w').write(s.replace(old, new))" "$d/$3" "$4" "$5" || { echo "break $1 does not apply"; return; }
  (cd $d && CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$d:/tmp/sp:/tmp/site timeout 160 python3 -m pytest -q -p no:cacheprovider -rfE \
     tests/gpu/test_sparse_kernels.py -k "atomic and (one_launch or rows_past_2048)" > $K/break_$1.log 2>&1
   echo "break $1 rc $? $(( $(date +%s) - T0 )) s: $(tail -1 $K/break_$1.log)")
}
(brk atomic_rounds_share_bins 0 sparrow_server/kernels/topk.py "'round_bins = bins + (16 - shift) * 32'" "'round_bins = bins'"
 brk atomic_bins_read_through_l1 0 sparrow_server/kernels/radix.py "'tl.arange(0, 256), cache_modifier=\".cg\")'" "'tl.arange(0, 256))'") &
(brk atomic_bins_read_unsynced 1 sparrow_server/kernels/radix.py "'tl.debug_barrier()\n    return tl.load(bins + tl.arange(0, 256)'" "'return tl.load(bins + tl.arange(0, 256)'") &
wait
grep -h "FAILED\|passed\|failed" $K/break_*.log
tar -czf $OUT/call32_5.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
