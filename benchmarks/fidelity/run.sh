#!/usr/bin/env bash
# The fidelity study end to end (what produced benchmarks/results/fidelity.md), from the repo root.
# CPU only; about 10 min of generation and ~45 min of scoring wall time on 2 busy cores.
set -euo pipefail
R=${ROLLOUTS:-/tmp/fidelity}
W=${WORK:-/tmp/fid-work320}
BUDGETS=64,128,192,256
export PYTHONPATH=${PYTHONPATH:-.}
python benchmarks/fidelity/generate.py --out "$R" --per-kind 3 --new-tokens 320
python benchmarks/fidelity/score.py grid --rollouts "$R" --work "$W" --budgets $BUDGETS --shard 0/2 &
python benchmarks/fidelity/score.py grid --rollouts "$R" --work "$W" --budgets $BUDGETS --shard 1/2
wait
python benchmarks/fidelity/analyze.py calibrate --rollouts "$R" --work "$W" --budgets $BUDGETS --bin-tokens 64
for i in 0 1; do
  python benchmarks/fidelity/score.py schedule --rollouts "$R" --work "$W" --split heldout --shard $i/2 \
    --schedule "$W/schedule.json" "$W/matched.json" &
done
wait
python benchmarks/fidelity/analyze.py report --rollouts "$R" --work "$W" --budgets $BUDGETS --bin-tokens 64 \
  --out benchmarks/results

# Finer budget grid (adds 160 and 224), same target 0.89: section (c)'s main comparison.
W2=${WORK_FINE:-/tmp/fid-work320b}
FINE=64,128,160,192,224,256
mkdir -p "$W2/acc" && cp "$W"/acc/*fixed-*.npy "$W2/acc/"
python benchmarks/fidelity/score.py grid --rollouts "$R" --work "$W2" --budgets 160,224 --shard 0/2 &
python benchmarks/fidelity/score.py grid --rollouts "$R" --work "$W2" --budgets 160,224 --shard 1/2
wait
python benchmarks/fidelity/analyze.py calibrate --rollouts "$R" --work "$W2" --budgets $FINE --bin-tokens 64 --target 0.89
for i in 0 1; do
  python benchmarks/fidelity/score.py schedule --rollouts "$R" --work "$W2" --split heldout --shard $i/2 \
    --schedule "$W2/schedule.json" "$W2/matched.json" &
done
wait
python benchmarks/fidelity/analyze.py report --rollouts "$R" --work "$W2" --budgets $FINE --bin-tokens 64 \
  --out benchmarks/results/fidelity/fine
