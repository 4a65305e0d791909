#!/bin/bash
# call 43, 5: the serving module's one test that call 43, 4's module timeout (330 s, too tight for six modules' cold
# compiles on one card) cut in its setup: the served selections against the float32 oracle
set -u
T0=$(date +%s); K=$OUT/call43_5; mkdir -p $K; cp "$0" $K/call_command.sh
eval "$(SITE=/tmp/site bash .kit/install.sh 2>/dev/null)"; python3 benchmarks/dev_entry_point.py /tmp/sp >/dev/null
export PYTHONPATH=$PWD:/tmp/sp:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm --format=csv > $K/cards.txt
bash benchmarks/gpu_host/run_gpu_suite.sh digest > $K/code_digest.txt 2>&1
OUT=$K timeout 190 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=5 \
  tests/gpu/test_sglang_serving.py -k test_sparse_selections_agree_with_the_oracle > $K/pytest.log 2>&1
echo "oracle test rc $? $(( $(date +%s) - T0 )) s" >> $K/walls.txt
tail -12 $K/pytest.log; cat $K/walls.txt
cd $OUT && tar czf call43_5.tgz call43_5 && rm -rf call43_5
