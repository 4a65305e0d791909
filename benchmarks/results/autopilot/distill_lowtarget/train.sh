#!/usr/bin/env bash
# DistillSparse adapter for a low-target schedule (schedule.json: [64, 80, 96, 112], 64-token bins, where
# target 0.75 should converge). Sparse rollouts (2 per prompt, 192 new tokens, EOS ignored, T = 1) of all 40
# prompts of benchmarks/fidelity/prompts.jsonl from the in-process reference engine; 10 prompts held out
# (the distill command's seeded split by prompt, seed 0); LoRA rank 16 all-linear, k3 loss, 80 steps of 2,
# learning rate LR; 2 torch threads (the machine is otherwise idle). Then heldout_gain.py re-scores the held-out
# rollouts per token and bootstraps the p5 gain over them.
# Usage: train.sh ADAPTER_DIR LR RESULTS_DIR (ADAPTER_DIR must not hold an adapter; its parent is the server's
# --adapter-root; RESULTS_DIR gets summary.json, log.txt, sparrow_adapter.json and heldout_gain.json).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="$1" LR="$2" RES="$3"
ROOT="$(dirname "$OUT")"
mkdir -p "$ROOT" "$RES"
ROLLOUTS="$ROOT/rollouts.jsonl"
SCHEDULE=benchmarks/results/autopilot/distill_lowtarget/schedule.json
if [ -f "$ROLLOUTS" ]; then
  SOURCE=(--rollouts "$ROLLOUTS")
else
  SOURCE=(--prompts benchmarks/fidelity/prompts.jsonl --save-rollouts "$ROLLOUTS")
fi
python -m sparrow_server.cli distill "${SOURCE[@]}" --samples-per-prompt 2 --schedule "$SCHEDULE" \
  --max-new-tokens 192 --ignore-eos --temperature 1.0 --seed 0 \
  --rank 16 --alpha 16 --lr "$LR" --steps 80 --batch 2 --loss k3 \
  --heldout-fraction 0.25 --threads 2 --out "$OUT" \
  > "$RES/summary.json" 2> >(tee "$RES/log.txt" >&2)
cp "$OUT/sparrow_adapter.json" "$RES/sparrow_adapter.json"
python benchmarks/autopilot/heldout_gain.py --rollouts "$ROLLOUTS" --schedule "$SCHEDULE" --adapter "$OUT" \
  --heldout-fraction 0.25 --seed 0 --out "$RES/heldout_gain.json" 2>> "$RES/log.txt"
