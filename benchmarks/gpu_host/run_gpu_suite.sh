#!/usr/bin/env bash
# The GPU test suite (tests/gpu/) on a GPU host, in parts that each fit one device call (< 9 min):
#   R=<repo root holding .kit and .whl> OUT=<returned folder> bash benchmarks/gpu_host/run_gpu_suite.sh PART
# PART all (2 GPUs, the whole suite in one command): serving, service, cross-engine, dense-layers,
#         exact-acceptance and deterministic tests on GPU 0, kernel, trainer compat, GQA-group-4 and sub-row tests on GPU 1,
#         the TP tests on both, all
#         at once (every server caps its KV pool or sizes it from the memory free at its start; trainer compat
#         measures what its server frees from NVML's per-process counts, so it need not have its card alone).
# On one GPU, three commands (the whole on one card runs past a call: the kernel module alone beside the others ran
# past 540 s in calls 26 and 27):
# PART 1: the sparse-kernel module's three shards, GQA-group-4 and sub-row tests at once on GPU $SUITE_GPU (default 0).
# PART 2: serving, service, cross-engine, dense-layers, exact-acceptance and deterministic tests at once on that GPU.
# PART 3: 1 GPU: trainer compat alone (where NVML cannot see the server's processes it falls back to the card's used
#         memory, right only on a card of its own; the TP tests skip). 2 GPUs: the TP tests on both cards, trainer
#         compat on GPU 1 beside them.
# PART breaks: benchmarks/gpu_host/breaks.py run on every GPU (each break in its own copy of the tree;
#         BREAK_GPUS=1 picks the GPUs, BREAKS_ONLY="name ..." the breaks).
# PART serving | service | kernels | dense_layers | exact_acceptance | deterministic | grouped | sub_rows | tp: that module
#         alone (GPU $SUITE_GPU,
#         default 0; the TP module on GPUs 0,1), e.g. beside a breaks part or a benchmark on the other card
#         (CUDA_VISIBLE_DEVICES is set per module, so only SUITE_GPU moves it).
# Each part appends to $OUT/gpu_suite_summary.txt (one line per module: its pytest result) and writes
# $OUT/gpu-suite-<PART>.tar.xz (pytest logs, server logs, the tests' JSON results).
# The cross-engine test needs SPARROW_GPU_MODEL_DIR (the converted SmolLM2, benchmarks/gpu_host/README.md).
set -uo pipefail
PART="${1:?part: all, 1, 2, 3, breaks or digest}"
R="${R:-$PWD}"; OUT="${OUT:-/tmp/gpu-suite-out}"; SITE="${SITE:-/tmp/site}"; SP="${SP:-/tmp/sp}"
W="/tmp/gpu-suite-$PART${BREAK_GPUS:+-gpu${BREAK_GPUS//,/}}"
mkdir -p "$OUT" "$W"
T0=$(date +%s)
log() { echo "[suite $PART +$(( $(date +%s) - T0 ))s] $*"; }

# The code a run tested: a device call copies the working tree, but its .git may be an older one, so
# the commit there can be stale. The digest of the code the suite runs (the product, the tests, this
# folder and the server launcher) is the same here and there:
# `bash benchmarks/gpu_host/run_gpu_suite.sh digest` at a commit prints what a run at that commit wrote.
code_digest() {
  find sparrow_server tests benchmarks/gpu_host benchmarks/sglang_server.py -type f \
    \( -name '*.py' -o -name '*.sh' -o -name '*.json' \) -not -path '*/__pycache__/*' \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}
if [ "$PART" = digest ]; then code_digest; exit 0; fi

if [ -f "$R/.kit/install.sh" ]; then
  # Two runs started at once (a module beside a break) share $SITE: one installs, the other waits for it.
  exec 9>"$SITE.lock"
  command -v flock >/dev/null && flock 9
  eval "$(cd "$R" && SITE="$SITE" bash .kit/install.sh 2>>"$OUT/install.log")"
  exec 9>&-
fi
[ -d "$SITE/sglang" ] || { log "no $SITE/sglang: install the kit first (carry .kit and .whl)"; exit 3; }
python3 benchmarks/dev_entry_point.py "$SP" >/dev/null
export PYTHONPATH=$PWD:$SP:$SITE${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L | wc -l)
log "$NGPU GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
echo "code digest $(code_digest) (run_gpu_suite.sh digest)" | tee "$W/code_state.txt" > "$OUT/code_state.txt"

module() {  # module GPUS NAME [SHARD -k EXPR]: tests/gpu/test_NAME.py (those of EXPR) on GPUS, files under $W/NAME[-SHARD]
  local gpus=$1 name=$2 shard=${3:-} expr=${4:-}
  local run="$name${shard:+-$shard}"
  mkdir -p "$W/$run"
  log "start $run on GPU $gpus"
  CUDA_VISIBLE_DEVICES=$gpus OUT="$W/$run" timeout "${MODULE_TIMEOUT_S:-500}" python3 -m pytest -q -p no:cacheprovider -rfEs \
    --durations=25 --basetemp="/tmp/pytest-$run" ${expr:+-k "$expr"} "tests/gpu/test_$name.py" > "$W/$run/pytest.log" 2>&1
  local rc=$?
  echo "$run (GPU $gpus, rc $rc, $(( $(date +%s) - T0 )) s into part $PART): $(tail -n 1 "$W/$run/pytest.log")" \
    >> "$W/summary.txt"
  tail -n 1 "$W/summary.txt" >> "$OUT/gpu_suite_progress.txt"  # kept if the call is cut short
  log "done $run rc=$rc: $(tail -n 1 "$W/$run/pytest.log")"
}

# The sparse-kernel module in three shards (rows past 2,048 candidates for every variant, the selection at a 40K
# context for every variant, and the rest): whole, beside the other modules, it ran past 540 s in calls 26 and 27 (61
# of 68 tests done at 540 s), and its second half of two took 506 of 540 s in call 32. The shards together are every
# test of it, each once (tests/e2e/test_gpu_suite_scripts.py checks that).
KERNEL_LONG_ROWS_EXPR="rows_past_2048"
KERNEL_AT_40K_EXPR="select_pages_at_40k"
KERNEL_REST_EXPR="not ($KERNEL_LONG_ROWS_EXPR or $KERNEL_AT_40K_EXPR)"

G=${SUITE_GPU:-0}  # the card of a single-module part
case "$PART" in
  all)
    [ "$NGPU" -ge 2 ] || { log "part all needs 2 GPUs; on one GPU run parts 1, 2 and 3"; exit 2; }
    MODULE_TIMEOUT_S=${MODULE_TIMEOUT_S:-480}  # the whole command stays inside one device call (< 9 min)
    # the kernel module in three shards, two on GPU 1 and one on GPU 0: beside the seven GPU-0 modules it ran past
    # 540 s in call 26, whole beside the other GPU-1 modules in call 27, and its larger half took 506 s in call 32
    module 0 sglang_serving & module 0 sglang_service & module 0 cross_engine &
    module 1 sparse_kernels long_rows "$KERNEL_LONG_ROWS_EXPR" & module 0 sparse_kernels at_40k "$KERNEL_AT_40K_EXPR" &
    module 1 sparse_kernels rest "$KERNEL_REST_EXPR" &
    module 0 dense_layers & module 0 exact_acceptance & module 0 deterministic & module 1 sglang_trainer_compat &
    module 1 grouped_query_heads & module 1 sub_rows & module 0,1 sglang_tp & wait ;;
  1)
    module "$G" sparse_kernels long_rows "$KERNEL_LONG_ROWS_EXPR" &
    module "$G" sparse_kernels at_40k "$KERNEL_AT_40K_EXPR" & module "$G" sparse_kernels rest "$KERNEL_REST_EXPR" &
    module "$G" grouped_query_heads & module "$G" sub_rows & wait ;;
  2)
    module "$G" sglang_serving & module "$G" sglang_service & module "$G" cross_engine &
    module "$G" dense_layers & module "$G" exact_acceptance & module "$G" deterministic & wait ;;
  3)
    if [ "$NGPU" -ge 2 ]; then module 0,1 sglang_tp & module 1 sglang_trainer_compat & wait
    else module 0 sglang_trainer_compat; fi ;;
  serving) module "$G" sglang_serving ;;
  kernels) module "$G" sparse_kernels ;;
  dense_layers) module "$G" dense_layers ;;
  exact_acceptance) module "$G" exact_acceptance ;;
  deterministic) module "$G" deterministic ;;
  grouped) module "$G" grouped_query_heads ;;
  sub_rows) module "$G" sub_rows ;;
  service) module "$G" sglang_service ;;
  tp) module 0,1 sglang_tp ;;
  breaks)
    gpus=${BREAK_GPUS:-$(seq -s, 0 $(( NGPU - 1 )))}
    log "breaks on GPUs $gpus"
    python3 benchmarks/gpu_host/breaks.py run --gpus "$gpus" --out "$W/breaks" ${BREAKS_ONLY:+--only $BREAKS_ONLY} \
      > "$W/breaks.log" 2>&1
    echo "breaks (GPUs $gpus, rc $?): $(grep -c '"caught": true' "$W/breaks/breaks.jsonl" 2>/dev/null) of" \
      "$(wc -l < "$W/breaks/breaks.jsonl" 2>/dev/null) caught" >> "$W/summary.txt"
    cp "$W/breaks/breaks.jsonl" "$OUT/breaks${BREAK_GPUS:+-gpu${BREAK_GPUS//,/}}.jsonl" 2>/dev/null ;;
  *) log "unknown part $PART"; exit 2 ;;
esac

cat "$W/summary.txt" | tee -a "$OUT/gpu_suite_summary.txt"
tar -C /tmp -cJf "$OUT/$(basename "$W").tar.xz" "$(basename "$W")" 2>/dev/null
log "packed $OUT/$(basename "$W").tar.xz ($(du -h "$OUT/$(basename "$W").tar.xz" | cut -f1))"
! grep -q "rc [1-9]" "$W/summary.txt"
