#!/bin/bash
# call 39, 5: the kernel bench's sparse attention on picks in runs of neighbouring pages (--runs-amplitude 2.5: as
# many neighbours at 16K as the dummy-weight server's picks; 5: more) against random keys' uniform-like picks, pages
# laid out as a fresh server lays a prompt (contiguous), at 32 x 32K and 64 x 16K; the two cards in opposite orders
set -u
T0=$(date +%s); K=$OUT/call39_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
bench() {  # card batch context amplitude
  CUDA_VISIBLE_DEVICES=$1 timeout 100 python3 benchmarks/sparse_kernel_bench.py --variants fused_kvstore_narrow \
    --kernels cuda-cores --placement contiguous --runs-amplitude $4 --batch $2 --contexts $3 \
    --out $K/kb_gpu$1_runs$4_b$2.json > $K/kb_gpu$1_runs$4_b$2.log 2>&1
  echo "gpu$1 runs$4 b$2 rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
(for a in 0 2.5 5; do bench 0 32 32768 $a; done; for a in 0 2.5; do bench 0 64 16384 $a; done) &
(for a in 5 2.5 0; do bench 1 32 32768 $a; done; for a in 2.5 0; do bench 1 64 16384 $a; done) &
wait
for f in $K/kb_*.log; do echo "== $f"; tail -2 $f; grep -o '"selected_pages_adjacency": [0-9.]*' $f | head -1; done
cat $K/walls.txt
cd $OUT && tar czf call39_5.tgz call39_5 && rm -rf call39_5
