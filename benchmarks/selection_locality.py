"""Which pages a served model's sparse layers select: shared by a request's KV heads, in runs of neighbours.

Why: the served speed runs use dummy weights (``--load-format dummy``), and the sparse attention's read speed depends
on the pages it reads. A request's KV heads picking the same pages read each token's heads as one contiguous row
(8 x 128 bf16 = 2 KiB at Qwen3-1.7B) where heads picking apart read 256 B pieces; neighbouring pages stream. This
runs one request through a sparse server with the selection recorder (eager: ``--disable-cuda-graph``) and reports,
per sparse layer, the top-k pages' overlap between heads (mean pairwise Jaccard) and the share of top-k pages next
to another top-k page of the same head, beside what uniform picks of as many pages among the candidates give.

Usage (GPU host): python benchmarks/selection_locality.py --out-dir DIR [--prompt 16384 --gen 200]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def top_k_pages(pages, length: int, page_size: int, sink: int, recent: int):
    """The pages of one record the top-k chose: those between the sink and the recent pages."""
    import numpy as np

    n = -(-length // page_size)
    pages = np.asarray(pages)
    return pages[(pages >= sink) & (pages < n - recent)]


def jaccard(a, b) -> float:
    sa, sb = set(a.tolist()), set(b.tolist())
    return len(sa & sb) / max(len(sa | sb), 1)


def adjacency(pages) -> float:
    """Share of the pages with a neighbour (page +- 1) among them."""
    s = set(pages.tolist())
    return sum((p - 1 in s) or (p + 1 in s) for p in s) / max(len(s), 1)


def heads_locality(picks) -> tuple[float, float]:
    """(mean head-pair Jaccard, mean adjacency) of one step's heads' page picks (one head: Jaccard 1)."""
    import numpy as np

    pairs = [jaccard(a, b) for i, a in enumerate(picks) for b in picks[i + 1:]]
    return float(np.mean(pairs)) if pairs else 1.0, float(np.mean([adjacency(p) for p in picks]))


def uniform_baseline(k: int, lo: int, hi: int, heads: int, seed: int = 0) -> tuple[float, float]:
    """``heads_locality`` of ``heads`` uniform picks of ``k`` pages in [lo, hi)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return heads_locality([rng.choice(np.arange(lo, hi), size=k, replace=False) for _ in range(heads)])


def locality(records: dict, page_size: int, sink: int, recent: int) -> dict:
    """Per sparse layer: mean head-pair Jaccard and adjacency of the top-k pages over the recorded steps, and the
    uniform baseline at the same counts. ``records``: ``selection_debug.load_records``."""
    import numpy as np

    groups: dict = {}
    for i, layer in enumerate(records["layer"].tolist()):
        key = (layer, int(records["prompt_len"][i]), int(records["length"][i]))
        groups.setdefault(key, []).append(top_k_pages(records["pages"][i], key[2], page_size, sink, recent))
    per_layer: dict = {}
    for (layer, _, length), heads in sorted(groups.items()):
        n = -(-length // page_size)
        base = uniform_baseline(len(heads[0]), sink, n - recent, len(heads))
        row = per_layer.setdefault(layer, {"jaccard": [], "adjacency": [], "uniform_jaccard": [],
                                           "uniform_adjacency": [], "top_k": len(heads[0]),
                                           "candidates": n - recent - sink})
        for name, value in zip(("jaccard", "adjacency", "uniform_jaccard", "uniform_adjacency"),
                               (*heads_locality(heads), *base)):
            row[name].append(value)
    return {layer: {k: (round(float(np.mean(v)), 3) if isinstance(v, list) else v) for k, v in row.items()}
            for layer, row in per_layer.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--size", default="qwen3-1.7b")
    ap.add_argument("--schedule", default="qwen3-1.7b-0.86")
    ap.add_argument("--prompt", type=int, default=16384)
    ap.add_argument("--gen", type=int, default=200)
    ap.add_argument("--port", type=int, default=30300)
    a = ap.parse_args()
    import sglang_server as S

    from sparrow_server.sglang_plugin.scheduler.selection_debug import load_records
    from sparrow_server.sparsity.registry import ScheduleRegistry

    out = Path(a.out_dir)
    sel = out / "selections"
    sel.mkdir(parents=True, exist_ok=True)
    schedule = ScheduleRegistry().get(a.schedule)
    model_dir = S.write_config(out / "model", S.qwen3_config(a.size))
    env = {"SPARROW_DEFAULT_SCHEDULE": schedule.name, "SPARROW_TOPK_CAP_TOKENS": str(max(schedule.budgets_tokens)),
           "SPARROW_DEBUG_SELECTIONS": str(sel), "SPARROW_DEBUG_SELECTIONS_EVERY": "64"}
    flags = ["--load-format", "dummy", "--page-size", str(schedule.page_size), "--disable-radix-cache",
             "--disable-cuda-graph", "--context-length", "40960", "--attention-backend", "sparrow"]
    prompt = [random.Random(0).randrange(100, 151836) for _ in range(a.prompt)]
    with S.Server(model_dir, flags, out / "server.log", port=a.port, env=env) as srv:
        S.generate(srv.base, [prompt], a.gen)
    result = {"size": a.size, "schedule": schedule.name, "prompt": a.prompt, "gen": a.gen, "load_format": "dummy",
              "per_layer": locality(load_records(sel), schedule.page_size, schedule.sink_pages, schedule.recent_pages)}
    (out / "selection_locality.json").write_text(json.dumps(result, indent=1))
    print(f"{'layer':>5} {'top-k':>6} {'cands':>6} {'jaccard':>8} {'uniform':>8} {'adjacent':>9} {'uniform':>8}")
    for layer, r in result["per_layer"].items():
        print(f"{layer:>5} {r['top_k']:>6} {r['candidates']:>6} {r['jaccard']:>8} {r['uniform_jaccard']:>8} "
              f"{r['adjacency']:>9} {r['uniform_adjacency']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
