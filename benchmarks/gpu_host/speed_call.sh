#!/usr/bin/env bash
# Issue 24's decode measurements in one device call, on one GPU (GPU=1 leaves GPU 0 to a suite part):
#   R=<repo root holding .kit and .whl> OUT=<returned folder> GPU=1 bash benchmarks/gpu_host/speed_call.sh
# 1. the selection kernels at 16K/32K/33K/40K context, every variant (benchmarks/sparse_kernel_bench.py);
# 2. the variant fastest at 32K and past it (the mean selection time over the cases >= 32K) serves
# 3. dense vs sparse decode at 32K, batch 16 and 32, servers at --context-length 40960 (the preset schedule);
# 4. the sparse server again with a schedule that keeps no layer dense (a ceiling: its acceptance is unmeasured).
set -uo pipefail
R="${R:-$PWD}"; OUT="${OUT:-/tmp/speed-out}"; SITE="${SITE:-/tmp/site}"; GPU="${GPU:-0}"
DECODE="${DECODE:-32768x16,32768x32}"
D="$OUT/speed"; mkdir -p "$D"
if [ ! -d "$SITE/sglang" ]; then eval "$(cd "$R" && SITE="$SITE" bash .kit/install.sh 2>>"$D/install.log")"; fi
python3 benchmarks/dev_entry_point.py "${SP:-/tmp/sp}" >/dev/null
export PYTHONPATH=$PWD:${SP:-/tmp/sp}:$SITE${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$GPU
echo "code digest $(bash benchmarks/gpu_host/run_gpu_suite.sh digest); $(nvidia-smi -i "$GPU" --query-gpu=name --format=csv,noheader)" \
  | tee "$D/code_state.txt"
python3 benchmarks/sparse_kernel_bench.py --batch 16 --contexts 16384,32768,33024,40960 --server-contexts 40960 \
  --schedule qwen3-1.7b-0.86 --variants v1,split,even,hist --out "$D/sparse_kernel_bench.json" > "$D/kernel_bench.log" 2>&1
echo "kernel bench rc $?"; tail -n 20 "$D/kernel_bench.log"
VARIANT=$(python3 - "$D/sparse_kernel_bench.json" <<'PY'
import json, sys
cases = [c for c in json.load(open(sys.argv[1]))["cases"] if c["context"] >= 32768]
names = [v for v in cases[0]["variants"] if all("error" not in c["variants"][v] for c in cases)]
print(min(names, key=lambda v: sum(c["variants"][v]["selection_us"] for c in cases)))
PY
)
echo "serving with SPARROW_SELECT_VARIANT=${VARIANT:=v1}" | tee "$D/variant.txt"
export SPARROW_SELECT_VARIANT=$VARIANT
python3 benchmarks/sglang_throughput.py --sizes qwen3-1.7b --decode "$DECODE" --rollout-gen 0 --time-budget-s 280 \
  --note "preset schedule, selection variant $VARIANT" --out-dir "$D/preset" > "$D/preset.log" 2>&1
echo "preset rc $?"; grep "^==\|total\|rror" "$D/preset.log" | tail -n 8
python3 benchmarks/sglang_throughput.py --sizes qwen3-1.7b --decode "$DECODE" --rollout-gen 0 --time-budget-s 150 --backends sparrow \
  --schedule-file benchmarks/schedules/qwen3-1.7b-0.86-no-dense-layers.json \
  --note "ceiling: no dense layers, acceptance unmeasured; variant $VARIANT" --out-dir "$D/ceiling" > "$D/ceiling.log" 2>&1
echo "ceiling rc $?"; grep "sparrow\]\|total\|rror" "$D/ceiling.log" | tail -n 8
