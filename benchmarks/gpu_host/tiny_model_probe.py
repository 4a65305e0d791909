"""CPU probes of the GPU tests' tiny Qwen3 (``sglang_server.write_tiny_checkpoint``), behind two choices
of the GPU suite (benchmarks/results/gpu_suite/README.md):

- ``outputs --attn-scale S``: greedy outputs of the float32 model on the serving tests' long prompts,
  and how far the 512-token schedule (``qwen3-1.7b-0.86``) moves the chosen tokens' logprobs (teacher
  forced, float32), and how far bf16 moves them (dense and sparse): the scale at which outputs vary and
  depend on the pages read, without sparse attention deciding everything.
- ``exact-teeth --lm-head-std S --budget B``: for tests/gpu/test_exact_acceptance.py, a 64-token completion
  sampled at temperature 1 (float32) after that test's prompt, and per position the sum-min of the sparse
  (fixed ``B``-token budget) and dense distributions, and of the sparse row against the previous position's
  dense row (what an off-by-one comparison would give): the test's checks need both well away from 1.
- ``selection-floor --tokens serving_tokens.json``: on a GPU run's tokens, how often the reference's
  page selection in bf16 equals its selection in float32 (what rounding explains).

    python benchmarks/gpu_host/tiny_model_probe.py outputs --attn-scale 2 [--prompts 2] [--query-heads 32]
    python benchmarks/gpu_host/tiny_model_probe.py exact-teeth --lm-head-std 0.15 --budget 64
    python benchmarks/gpu_host/tiny_model_probe.py selection-floor --tokens PATH [--prompts 2]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "gpu_host")]

SCHEDULE = "qwen3-1.7b-0.86"
NEW = 48


def long_prompts(n: int) -> list[list[int]]:
    """The serving tests' long prompts (tests/gpu/test_sglang_serving.py ``_prompts``)."""
    rng = random.Random(0)
    return [[rng.randrange(10, 4000) for _ in range(1500 + 5 * i)] for i in range(4)][:n]


def _models(attn_scale: float, lm_head_std: float = 0.5, query_heads: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM

    import sglang_server as S

    path = S.write_tiny_checkpoint(Path(tempfile.mkdtemp()) / "tiny", seed=0, lm_head_std=lm_head_std, attn_scale=attn_scale,
                                   query_heads=query_heads)
    load = lambda dtype: AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return load(torch.float32), load(torch.bfloat16)


def _schedule():
    from sparrow_server.sparsity.registry import builtin_schedules

    return {s.name: s for s in builtin_schedules()}[SCHEDULE]


def _chosen_logprobs(model, ids, prompt_len: int, schedule):
    import torch

    from sparrow_server.modeling.sparse_forward import teacher_forced_logits

    with torch.inference_mode():
        logits = (teacher_forced_logits(model, ids, prompt_len, schedule) if schedule is not None
                  else model(input_ids=ids[None], use_cache=False).logits[0].float())
    lp = torch.log_softmax(logits.float(), -1)[prompt_len - 1:-1]
    return lp.gather(1, ids[prompt_len:, None])[:, 0].double()


def outputs(attn_scale: float, n: int, query_heads: int | None = None) -> dict:
    import numpy as np
    import torch

    f32, b16 = _models(attn_scale, query_heads=query_heads)
    sched = _schedule()
    rows, pooled = [], {"sparse_vs_dense": [], "dense_bf16": [], "sparse_bf16": []}
    for p in long_prompts(n):
        with torch.inference_mode():
            out = f32.generate(torch.tensor([p]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
        ids = out[0]
        dense, sparse = _chosen_logprobs(f32, ids, len(p), None), _chosen_logprobs(f32, ids, len(p), sched)
        diffs = {"sparse_vs_dense": (sparse - dense).abs(),
                 "dense_bf16": (_chosen_logprobs(b16, ids, len(p), None) - dense).abs(),
                 "sparse_bf16": (_chosen_logprobs(b16, ids, len(p), sched) - sparse).abs()}
        for k, v in diffs.items():
            pooled[k].append(v.numpy())
        rows.append({"distinct_tokens": len(set(ids[len(p):].tolist())),
                     "sparse_vs_dense_median": float(diffs["sparse_vs_dense"].median()),
                     "sparse_vs_dense_max": float(diffs["sparse_vs_dense"].max())})
    q = lambda x: {"median": float(np.median(x)), "p99": float(np.quantile(x, 0.99)), "max": float(x.max())}
    return {"attn_scale": attn_scale, "query_heads": query_heads or "default", "new_tokens": NEW, "per_prompt": rows,
            **{k: q(np.concatenate(v)) for k, v in pooled.items()}}


def exact_teeth(lm_head_std: float, budget: int) -> dict:
    import random

    import numpy as np
    import torch

    from sparrow_server.modeling.sparse_forward import teacher_forced_logits
    from sparrow_server.sparsity.schedule import Schedule

    f32, _ = _models(2.0, lm_head_std)
    prompt = [random.Random(25).randrange(10, 4000) for _ in range(1500)]  # the test's prompt
    torch.manual_seed(7)
    with torch.inference_mode():
        ids = f32.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0)[0]
        dense = torch.softmax(f32(input_ids=ids[None], use_cache=False).logits[0].float(), -1)[len(prompt) - 1:-1]
        sched = Schedule(name=f"probe-fixed-{budget}", budgets_tokens=(budget,) * 4)
        sparse = torch.softmax(teacher_forced_logits(f32, ids, len(prompt), sched).float(), -1)[len(prompt) - 1:-1]
    same = torch.minimum(sparse, dense).sum(-1).numpy()
    shifted = torch.minimum(sparse[1:], dense[:-1]).sum(-1).numpy()
    return {"lm_head_std": lm_head_std, "budget": budget, "distinct_tokens": len(set(ids[len(prompt):].tolist())),
            "sum_min": {"min": float(same.min()), "median": float(np.median(same))},
            "off_by_one_max_difference": float(np.abs(same[1:] - shifted).max())}


def selection_floor(tokens_path: Path, n: int) -> dict:
    import numpy as np
    import torch

    import cross_engine as X

    tokens = json.loads(tokens_path.read_text())["sparrow-selections"]["sparse"]["tokens"]
    f32, b16 = _models(2.0)
    sched = _schedule()
    equal, per_layer = [], {}
    for p, c in zip(long_prompts(n), tokens):
        ids = torch.tensor(p + c)
        wanted = {layer: [t for t in range(len(p), len(ids)) if (t + 1) % 4 == 0] for layer in range(2, 6)}
        a = X.tf_selections(f32, ids, len(p), sched, wanted)
        b = X.tf_selections(b16, ids, len(p), sched, wanted)
        for (layer, t), heads in a.items():
            for h, pages in enumerate(heads):
                same = set(pages.tolist()) == set(b[(layer, t)][h].tolist())
                equal.append(same)
                per_layer.setdefault(layer, []).append(same)
    return {"records": len(equal), "agree_share": float(np.mean(equal)),
            "agree_share_by_layer": {str(k): float(np.mean(v)) for k, v in sorted(per_layer.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("outputs")
    o.add_argument("--attn-scale", type=float, required=True)
    o.add_argument("--prompts", type=int, default=2)
    o.add_argument("--query-heads", type=int, default=None, help="32: the GQA-group-4 test's model")
    e = sub.add_parser("exact-teeth")
    e.add_argument("--lm-head-std", type=float, required=True)
    e.add_argument("--budget", type=int, required=True)
    f = sub.add_parser("selection-floor")
    f.add_argument("--tokens", type=Path, required=True, help="serving_tokens.json of a GPU serving run")
    f.add_argument("--prompts", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    result = (outputs(args.attn_scale, args.prompts, args.query_heads) if args.cmd == "outputs"
              else exact_teeth(args.lm_head_std, args.budget) if args.cmd == "exact-teeth"
              else selection_floor(args.tokens, args.prompts))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
