#!/usr/bin/env bash
# DistillSparse adapter for the autopilot's converged schedule (schedule.json: [64, 96, 144, 176], 64-token
# bins). Sparse rollouts (2 per prompt, 192 new tokens, EOS ignored, T = 1) of the 20 "calibration" prompts of
# benchmarks/fidelity/prompts.jsonl from the in-process reference engine, sampled once (ADAPTER_DIR's
# .rollouts.jsonl next to it, reused by later calls); 4 of those prompts held out (split by prompt, seeded) for
# the before/after check; LoRA rank 16 all-linear, k3 loss, 40 steps of 2, learning rate LR. One torch thread.
# Usage: train.sh ADAPTER_DIR LR RESULTS_DIR (ADAPTER_DIR must not hold an adapter; its parent is the server's
# --adapter-root; RESULTS_DIR gets summary.json, log.txt and sparrow_adapter.json).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="$1" LR="$2" RES="$3"
ROOT="$(dirname "$OUT")"
mkdir -p "$ROOT" "$RES"
ROLLOUTS="$ROOT/rollouts.jsonl"
if [ -f "$ROLLOUTS" ]; then
  SOURCE=(--rollouts "$ROLLOUTS")
else
  grep '"split": "calibration"' benchmarks/fidelity/prompts.jsonl > "$ROOT/prompts.jsonl"
  SOURCE=(--prompts "$ROOT/prompts.jsonl" --save-rollouts "$ROLLOUTS")
fi
python -m sparrow_server.cli distill "${SOURCE[@]}" --samples-per-prompt 2 \
  --schedule benchmarks/results/autopilot/distill/schedule.json \
  --max-new-tokens 192 --ignore-eos --temperature 1.0 --seed 100000 \
  --rank 16 --alpha 16 --lr "$LR" --steps 40 --batch 2 --loss k3 \
  --heldout-fraction 0.2 --threads 1 --out "$OUT" \
  > "$RES/summary.json" 2> >(tee "$RES/log.txt" >&2)
cp "$OUT/sparrow_adapter.json" "$RES/sparrow_adapter.json"
