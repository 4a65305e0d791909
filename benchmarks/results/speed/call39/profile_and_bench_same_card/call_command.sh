#!/bin/bash
# call 39, 6: the served sparse decode's per-layer profile at 32K x 32 and the kernel bench at the same shape on the
# same card, each card in the opposite order: does the bench read at the server's speed on one card?
set -u
T0=$(date +%s); K=$OUT/call39_6; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
prof() {  # card port
  CUDA_VISIBLE_DEVICES=$1 timeout 150 python3 benchmarks/decode_profile.py --context 32768 --batch 32 --backends sparrow \
    --server-args "--mem-fraction-static 0.89" --port $2 --out-dir $K/profile_gpu$1 > $K/profile_gpu$1.log 2>&1
  echo "profile gpu$1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
bench() {  # card
  CUDA_VISIBLE_DEVICES=$1 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow \
    --kernels cuda-cores --placement contiguous --batch 32 --contexts 32768 --out $K/kb_gpu$1_b32.json \
    > $K/kb_gpu$1_b32.log 2>&1; echo "bench gpu$1 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(prof 0 30100; bench 0) & (bench 1; prof 1 30200) & wait
for f in $K/kb_*.log; do echo "== $f"; tail -2 $f; done; grep -h "^## \|^| 5 " $K/profile_gpu*/decode_profile.md
cat $K/walls.txt
cd $OUT && tar czf call39_6.tgz call39_6 && rm -rf call39_6
