#!/bin/bash
# call 44, 3: the served float8 selection test (landed after call 43, not yet run) and the break that must fail it
# (float8_landmark_scale_dropped: the scoring drops the pages' scales; it also runs the kernel test it breaks)
set -u
T0=$(date +%s); K=$OUT/call44_3; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=5 \
  tests/gpu/test_sglang_serving.py -k test_float8_selections_agree_with_the_oracle > $K/pytest.log 2>&1
echo "float8 served test rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
timeout $(( 570 - ($(date +%s) - T0) )) python3 benchmarks/gpu_host/breaks.py run --gpus 0 --out $K/breaks \
  --only float8_landmark_scale_dropped > $K/breaks.log 2>&1
echo "break rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -8 $K/pytest.log; tail -15 $K/breaks.log; cat $K/walls.txt
cd $OUT && tar czf call44_3.tgz call44_3 && rm -rf call44_3
