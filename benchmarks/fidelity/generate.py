"""Fidelity study, step 1: sample rollouts from SmolLM2-135M-Instruct (dense attention, T = 1).

Dense sampling (HF ``generate`` with a KV cache, no top-k/top-p truncation, EOS suppressed so
every rollout reaches ``--new-tokens``), all prompts in one left-padded batch. The acceptance of
every sparse configuration is then measured on these same token sequences (``score.py``).

    python benchmarks/fidelity/generate.py --out /tmp/fidelity --per-kind 3 --new-tokens 320
    python benchmarks/fidelity/generate.py --out /tmp/fidelity-long --continue-from /tmp/fidelity --new-tokens 640

``--continue-from`` extends earlier rollouts (same sampling, a fresh seed): the result is a sample
of the longer length, since dense sampling is sequential.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_PROMPTS = HERE / "prompts.jsonl"


def select_prompts(path: Path, per_kind: int) -> list[dict]:
    """The first ``per_kind`` prompts of each (kind, split): a balanced subset."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    taken: dict[tuple[str, str], int] = {}
    out = []
    for row in rows:
        key = (row["kind"], row["split"])
        if taken.get(key, 0) < per_kind:
            taken[key] = taken.get(key, 0) + 1
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-kind", type=int, default=3, help="prompts per (kind, split)")
    parser.add_argument("--new-tokens", type=int, default=320)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--continue-from", type=Path, default=None, help="a previous --out folder to extend")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sparrow_server.engine.chat_template import chat_template_ids, user_turn
    from sparrow_server.models import load_model

    loaded = load_model(None)
    model, tok = loaded.model, loaded.tokenizer
    if args.continue_from is not None:
        rows = [json.loads(line) for line in (args.continue_from / "rollouts.jsonl").read_text().splitlines()]
        prompts = [r["prompt_ids"] + r["completion_ids"] for r in rows]
    else:
        rows = select_prompts(args.prompts, args.per_kind)
        prompts = [chat_template_ids(tok, user_turn(r["prompt"])) for r in rows]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    suppress = sorted({tid for tid in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"),
                                       tok.convert_tokens_to_ids("<|im_start|>")) if isinstance(tid, int)})
    torch.manual_seed(args.seed)
    start = time.time()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0, suppress_tokens=suppress,
                             pad_token_id=pad)
    elapsed = time.time() - start
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rollouts.jsonl", "w") as f:
        for row, prefix, seq in zip(rows, prompts, out):
            if args.continue_from is not None:
                row = {**row, "completion_ids": row["completion_ids"] + seq[width:].tolist()}
            else:
                row = {**row, "prompt_ids": prefix, "completion_ids": seq[width:].tolist()}
            f.write(json.dumps(row) + "\n")
    meta = {"model": loaded.name, "sampling": "dense, T=1, no top-k/top-p, EOS suppressed", "seed": args.seed,
            "sequences": len(rows), "new_tokens": args.new_tokens, "generate_s": round(elapsed, 1),
            "continued_from": str(args.continue_from) if args.continue_from else None,
            "threads": args.threads, "suppressed_token_ids": suppress}
    (args.out / "rollouts_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
