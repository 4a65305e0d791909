#!/usr/bin/env bash
# DistillSparse demonstration on the embedded SmolLM2-135M-Instruct (CPU, one thread).
# Sparse rollouts (1 per prompt, 192 new tokens) of 20 fidelity prompts under the tight schedule
# (fixed 64-token budget) from the in-process reference engine; 5 prompts held out;
# LoRA (rank 16, all-linear) trained with the k3 loss; held-out exact acceptance before/after, and
# the looser schedule (fixed 128 tokens) without adapter on the same held-out rollouts.
# Usage: run_demo.sh [OUT_DIR] (must not hold an adapter). The smaller first run: runs/small/command.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-/tmp/distill-demo-20}"
mkdir -p "$OUT"
python -m sparrow_server.cli distill \
  --prompts benchmarks/distill/prompts-20.jsonl --samples-per-prompt 1 \
  --schedule benchmarks/distill/fixed-64.json \
  --compare-schedule benchmarks/distill/fixed-128.json \
  --max-new-tokens 192 --ignore-eos --temperature 1.0 --seed 0 \
  --rank 16 --alpha 16 --lr 1e-3 --steps 24 --batch 2 --loss k3 \
  --heldout-fraction 0.25 --threads 1 \
  --save-rollouts "$OUT/rollouts.jsonl" --out "$OUT/adapter" \
  > "$OUT/summary.json" 2> >(tee "$OUT/log.txt" >&2)
