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
