#!/usr/bin/env bash
# DistillSparse demonstration on the embedded SmolLM2-135M-Instruct (CPU, one thread).
# Sparse rollouts of 12 prompts under the tight schedule (fixed 64-token budget) from the in-process
# reference engine; 4 prompts held out; LoRA trained with the k3 loss; held-out acceptance
# before/after, and the looser schedule (fixed 128 tokens) without adapter for comparison.
# Measured: 4 min 54 s wall, 3 min 14 s CPU. Usage: command.sh [OUT_DIR] (must not hold an adapter)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT="${1:-/tmp/distill-demo}"
mkdir -p "$OUT"
python -m sparrow_server.cli distill \
  --prompts benchmarks/distill/prompts-12.jsonl \
  --schedule benchmarks/distill/fixed-64.json \
  --compare-schedule benchmarks/distill/fixed-128.json \
  --max-new-tokens 192 --ignore-eos --temperature 1.0 --seed 0 \
  --rank 16 --alpha 16 --lr 1e-3 --steps 16 --batch 2 --loss k3 \
  --heldout-fraction 0.34 --threads 1 \
  --save-rollouts "$OUT/rollouts.jsonl" --out "$OUT/adapter" \
  > "$OUT/summary.json" 2> >(tee "$OUT/log.txt" >&2)
