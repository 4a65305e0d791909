#!/usr/bin/env bash
# DistillSparse adapter with the tv loss (total variation over the full vocabulary, 1 - exact acceptance) for
# the low-target schedule of ../distill_lowtarget (schedule.json: [64, 80, 96, 112], 64-token bins, target 0.75).
# Rollouts: rollouts.jsonl here, 4 sparse rollouts per prompt of all 40 prompts (192 new tokens, EOS ignored,
# T = 1; how they were sampled: README.md); 10 prompts held out (the distill command's seeded split by prompt,
# seed 0: the same 10 as ../distill_lowtarget). LoRA rank 16 all-linear, 160 steps of 2, learning rate LR;
# 2 torch threads. Then heldout_gain.py re-scores the held-out rollouts per token, also one page lower in
# bins 1-3 ([64, 64, 80, 96]), and bootstraps the p5 gains over held-out rollouts.
# Usage: train.sh ADAPTER_DIR LR RESULTS_DIR (ADAPTER_DIR must not hold an adapter; its parent is the server's
# --adapter-root; RESULTS_DIR gets summary.json, log.txt, sparrow_adapter.json and heldout_gain.json).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="$1" LR="$2" RES="$3"
HERE=benchmarks/results/autopilot/distill_tv
mkdir -p "$(dirname "$OUT")" "$RES"
python -m sparrow_server.cli distill --rollouts "$HERE/rollouts.jsonl" --schedule "$HERE/schedule.json" \
  --temperature 1.0 --seed 0 --rank 16 --alpha 16 --lr "$LR" --steps 160 --batch 2 --loss tv \
  --heldout-fraction 0.25 --threads 2 --out "$OUT" \
  > "$RES/summary.json" 2> >(tee "$RES/log.txt" >&2)
cp "$OUT/sparrow_adapter.json" "$RES/sparrow_adapter.json"
python benchmarks/autopilot/heldout_gain.py --rollouts "$HERE/rollouts.jsonl" --schedule "$HERE/schedule.json" \
  --adapter "$OUT" --heldout-fraction 0.25 --seed 0 --lower-budgets 64,64,80,96 \
  --out "$RES/heldout_gain.json" 2>> "$RES/log.txt"
