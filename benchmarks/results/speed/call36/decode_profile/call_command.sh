# call 36, 3: per-layer profiles of one decode graph replay at 32K x 16 at fused_kvstore_narrow the default, the
# sparse server on GPU 1 beside the dense one on GPU 0 (as call 26's, which ran them one after the other on one card)
T0=$(date +%s); eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null; export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
K=/tmp/k363; mkdir -p $K; nvidia-smi -L > $K/cards.txt; bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt; cp call36_3.sh $K/call_command.sh
(CUDA_VISIBLE_DEVICES=1 timeout -s INT 190 python3 benchmarks/decode_profile.py --context 32768 --batch 16 --backends sparrow --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_32k_b16_sparrow > $K/profile_sparrow.log 2>&1; echo "sparrow profile rc $? $(( $(date +%s) - T0 )) s") &
(CUDA_VISIBLE_DEVICES=0 timeout -s INT 190 python3 benchmarks/decode_profile.py --context 32768 --batch 16 --backends flashinfer --server-args "--mem-fraction-static 0.89" --out-dir $K/profile_32k_b16_flashinfer > $K/profile_flashinfer.log 2>&1; echo "flashinfer profile rc $? $(( $(date +%s) - T0 )) s") &
wait; tail -30 $K/profile_sparrow.log; tar -czf $OUT/call36_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
