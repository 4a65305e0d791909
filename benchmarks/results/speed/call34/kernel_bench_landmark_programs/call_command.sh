# call 34, 1: fused_hoisted_narrow (the twenty-fourth session's: plan loads together, reserved pages gathered before
# the scoring and stored after it, the completed landmarks by programs of their own) against the default
# fused_joint_narrow -- its GPU kernel tests, the phase profile of both at 33K and 37K, then its GPU kernel tests on two
# deliberate breaks of it (copies of the tree) on GPU 0, beside the kernel bench at batch 16, 32, 34 and 64 on GPU 1;
# the pick over the four benches
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k1; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call34_1.sh $K/call_command.sh
python3 -c "import triton; print(triton.__version__)" > $K/triton.txt 2>&1
V=fused_joint_narrow,fused_hoisted_narrow
brk() {  # NAME GPU FILE OLD NEW (OLD, NEW: Python string literals) -K
  local d=/tmp/brk-$1; rm -rf $d; mkdir -p $d
  tar --exclude=./.whl --exclude=./.whl-dl --exclude=./.kit --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -xf - -C $d
  python3 -c "import ast, sys; p, old, new = sys.argv[1], ast.literal_eval(sys.argv[2]), ast.literal_eval(sys.argv[3]); s = open(p).read(); assert s.count(old) == 1, old; open(p, 'w').write(s.replace(old, new))" "$d/$3" "$4" "$5" || { echo "break $1 does not apply"; return; }
  (cd $d && CUDA_VISIBLE_DEVICES=$2 PYTHONPATH=$d:/tmp/sp:/tmp/site timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE \
     tests/gpu/test_sparse_kernels.py -k "$6" > $K/break_$1.log 2>&1
   echo "break $1 rc $? $(( $(date +%s) - T0 )) s: $(tail -1 $K/break_$1.log)")
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/gpu/test_sparse_kernels.py -k "hoisted" > $K/gpu_sparse_kernels.log 2>&1; echo "kernel tests rc $? $(( $(date +%s) - T0 )) s"
 timeout 90 python3 benchmarks/selection_phase_profile.py --batch 16 --contexts 33024,36864 --variants $V --out $K/phases_b16.json > $K/phases_b16.log 2>&1; echo "phases rc $? $(( $(date +%s) - T0 )) s"
 brk hoisted_update_programs_idle 0 sparrow_server/kernels/sparse_decode.py "'_page_mean(kbuf_ptr, lm_ptr, loc, (loc % PS) == PS - 1, H * D, PS, LM_BLOCK)'" "'_page_mean(kbuf_ptr, lm_ptr, loc, (loc % PS) == PS + 1, H * D, PS, LM_BLOCK)'" "hoisted and completed_page"
 brk hoisted_sink_page_unstored 0 sparrow_server/kernels/sparse_decode.py "'tl.store(out + t, slot * H + h, mask=m)'" "'tl.store(out + t, slot * H + h, mask=m & (t > 0))'" "hoisted and (rows_past_2048 or 40k)") &
(export CUDA_VISIBLE_DEVICES=1
 timeout 150 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 16 --contexts 32768,33024,34816,36864,37120,40960 --out $K/kb_b16.json > $K/kb_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s"
 timeout 90 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 32 --contexts 33024,36864 --out $K/kb_b32.json > $K/kb_b32.log 2>&1; echo "b32 rc $? $(( $(date +%s) - T0 )) s"
 timeout 90 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 34 --contexts 33024,36864 --out $K/kb_b34.json > $K/kb_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s"
 timeout 90 python3 benchmarks/sparse_kernel_bench.py --variants $V --batch 64 --contexts 16384,17408 --out $K/kb_b64.json > $K/kb_b64.log 2>&1; echo "b64 rc $? $(( $(date +%s) - T0 )) s") &
wait
python3 benchmarks/pick_select_variant.py $K/kb_b16.json $K/kb_b32.json $K/kb_b34.json $K/kb_b64.json > $K/pick.txt 2> $K/pick.log; cat $K/pick.log $K/pick.txt; tail -3 $K/gpu_sparse_kernels.log
grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $K/kb_b*.log
tail -8 $K/phases_b16.log
tar -czf $OUT/call34_1.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
