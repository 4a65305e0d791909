#!/bin/bash
# call 49, 3 (a 2 x H200 host): call 2 again with a port for each server (call 2's two servers shared port 30100, so
# both clients' requests reached one: discarded; benchmarks/sglang_server.py now refuses a port another server answers).
# GPU 0: Qwen3-4B's sparse server (--backends sparrow) at 48 requests x 8K and x 16K with SPARROW_SELECT_VARIANT=
# fused_pages_narrow, then fused_kvstore_narrow (the same command, same card, back to back), then the kernel tests of
# the scoring past the fused rows (the default's split grid since its refactor onto request_duties, the whole-page
# grid); GPU 1: the dense server at the same workloads, then the GQA-group-4 module of the GPU suite (its servers
# now select with the group's default, fused_pages_narrow)
set -u
T0=$(date +%s); K=/tmp/k493; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1; cat $K/cards.txt $K/code_digest.txt
echo "setup $(( $(date +%s) - T0 )) s" >> $K/walls.txt
W=(--sizes qwen3-4b --decode 8192x48,16384x48 --rollout-gen 0 --server-args "--mem-fraction-static 0.89")
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  for V in fused_pages_narrow fused_kvstore_narrow; do
    SPARROW_SELECT_VARIANT=$V timeout -s INT 200 python3 benchmarks/sglang_throughput.py --port 30100 \
      --backends sparrow "${W[@]}" --out-dir $K/sparse_$V > $K/sparse_$V.log 2>&1
    echo "gpu0 sparse $V rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  done
  left=$(( 565 - ($(date +%s) - T0) )); [ $left -gt 40 ] && {
  timeout $left python3 -m pytest -q -p no:cacheprovider -rfEs --durations=10 tests/gpu/test_sparse_kernels.py \
    -k "split or whole_page or (rows_past_2048 and (kvstore or pages))" > $K/kt.log 2>&1
  echo "gpu0 kernel tests rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt; }
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout -s INT 200 python3 benchmarks/sglang_throughput.py --port 30200 --backends flashinfer "${W[@]}" \
    --out-dir $K/dense > $K/dense.log 2>&1
  echo "gpu1 dense rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
  left=$(( 570 - ($(date +%s) - T0) ))
  SUITE_GPU=1 OUT=$K/suite MODULE_TIMEOUT_S=$(( left > 60 ? left - 10 : 50 )) timeout $left \
    bash benchmarks/gpu_host/run_gpu_suite.sh grouped > $K/suite.log 2>&1
  echo "gpu1 grouped rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
}
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv -lms 1000 > $K/smi.csv 2>&1 & SMI=$!
gpu0 & P0=$!; gpu1 & P1=$!; wait $P0 $P1
kill $SMI
grep -h "decode_ctx\|healthy" $K/sparse_*.log $K/dense.log; tail -3 $K/kt.log; tail -3 $K/suite.log; cat $K/walls.txt
tar -czf $OUT/call49_3.tar.gz -C $K .; echo "total $(( $(date +%s) - T0 )) s"
