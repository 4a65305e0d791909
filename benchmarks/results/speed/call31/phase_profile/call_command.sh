# call 31, 2: the phase profile of the fused launch (benchmarks/selection_phase_profile.py) at batch 16 on GPU 0 and
# batch 34 on GPU 1: the default against the 4,096-lane tier (call 1: its top-k 4-10 us slower past 2,048 candidates)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k2; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call31_2.sh $K/call_command.sh
(CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/selection_phase_profile.py --batch 16 --contexts 32768,33024,34816 --variants fused_packed_narrow,fused_large_narrow,fused_early_narrow --out $K/phases_b16.json > $K/phases_b16.log 2>&1; echo "b16 rc $? $(( $(date +%s) - T0 )) s") &
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/selection_phase_profile.py --batch 34 --contexts 33024 --variants fused_packed_narrow,fused_large_narrow --out $K/phases_b34.json > $K/phases_b34.log 2>&1; echo "b34 rc $? $(( $(date +%s) - T0 )) s") &
wait
tail -12 $K/phases_b16.log; tail -5 $K/phases_b34.log
tar -czf $OUT/call31_2.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
