"""Cross-engine fidelity: a server's sparse rollouts, re-scored by the reference teacher-forced forward.

``generate``: sparse rollouts on a running server (``serve --engine sglang`` on the GPU host; any
Sparrow server speaks the same ``/generate``), one request per schedule, all schedules at once
(mixed-schedule batches), temperature 1, ``ignore_eos``, logprobs and the top-20 on. Each rollout's
dense top-20 then comes from one prefill-only ``/generate`` with the ``dense`` schedule, as the
live verifier does, and the rollout keeps the server's top-20 lower bound of acceptance per token.

``score``: the reference engine's teacher-forced sparse forward under the same schedule and the
plain dense forward (float32, ``--device``) on the same token sequences: per token the |difference|
between the server's and the reference's logprob of the sampled token, the exact acceptance, and
the lower bound against it per length bin. With ``--selections DIR`` (the backend's debug hook,
``SPARROW_DEBUG_SELECTIONS``), also the share of (token, layer, KV head) page selections that agree.

    python benchmarks/gpu_host/cross_engine.py generate --server URL --model DIR --budgets 256,512,1024 \\
        --dense --total-tokens 8192 --prompts-per-schedule 4 --out W/rollouts.jsonl
    python benchmarks/gpu_host/cross_engine.py score --rollouts W/rollouts.jsonl --model DIR --device cuda \\
        --bin-tokens 1024 --out W/cross_engine.json [--selections W/sel]
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from sparrow_server.engine.chat_template import chat_template_ids, user_turn
from sparrow_server.sparsity.schedule import Schedule, dense_schedule, schedule_from_dict

TOP_K = 20
DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "fidelity" / "prompts.jsonl"
SCHEDULE_PREFIX = "xe-fixed-"
QUANTILES = {"p5": 0.05, "median": 0.5, "p99": 0.99}


def tokenizer_of(model_dir: Path | None) -> Any | None:
    """The directory's tokenizer, or None (a weights-only directory: prompts must be token ids)."""
    if model_dir is None or not any((Path(model_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def fixed_schedule(budget: int) -> Schedule:
    return Schedule(name=f"{SCHEDULE_PREFIX}{budget}", budgets_tokens=(budget,),
                    description="cross-engine fidelity: one fixed budget")


def load_prompts(path: Path, tokenizer: Any | None) -> list[tuple[str, list[int]]]:
    """(id, token ids) per JSONL line: ``input_ids``, or ``prompt`` through the chat template."""
    out = []
    for i, line in enumerate(l for l in path.read_text().splitlines() if l.strip()):
        row = json.loads(line)
        if "input_ids" in row:
            ids = [int(t) for t in row["input_ids"]]
        else:
            if tokenizer is None:
                raise ValueError(f"{path}: line {i + 1} has a text prompt but the model has no tokenizer")
            ids = chat_template_ids(tokenizer, user_turn(row["prompt"]))
        out.append((str(row.get("id", i)), ids))
    return out


def assign(prompts: list[tuple[str, list[int]]], schedules: list[Schedule], per_schedule: int,
           distinct_lengths: bool) -> list[tuple[str, list[int], Schedule]]:
    """Which prompt runs under which schedule. ``distinct_lengths``: every (prompt, schedule) pair
    has its own prompt length (the selection debug hook tells requests apart by it), one per schedule
    in turn; otherwise the first ``per_schedule`` prompts under every schedule."""
    if not distinct_lengths:
        return [(pid, ids, s) for s in schedules for pid, ids in prompts[:per_schedule]]
    seen, pairs = set(), []
    for pid, ids in prompts:
        if len(ids) in seen:
            continue
        seen.add(len(ids))
        pairs.append((pid, ids, schedules[len(pairs) % len(schedules)]))
        if len(pairs) == per_schedule * len(schedules):
            break
    return pairs


def _parse_top(entries: Sequence[Sequence[Any]] | None, k: int) -> tuple[list[int], list[float]]:
    ids, lps = [-1] * k, [float("-inf")] * k
    for col, e in enumerate((entries or [])[:k]):
        lps[col], ids[col] = float(e[0]), int(e[1])
    return ids, lps


def generate(client: Any, pairs: list[tuple[str, list[int], Schedule]], total_tokens: int,
             top_k: int = TOP_K) -> list[dict]:
    """Sparse rollouts (one /generate per schedule, concurrently), then the dense top-k of each."""
    from sparrow_server.sglang_plugin.frontend.verification import topk_from_prefill_meta
    from sparrow_server.stats.acceptance import topk_acceptance_lower_bound
    from sparrow_server.sparsity import wire
    from sparrow_server.sparsity.schedule import dump_schedule

    by_schedule: dict[str, list[int]] = {}
    for i, (_, _, s) in enumerate(pairs):
        by_schedule.setdefault(s.name, []).append(i)
    for name, idx in by_schedule.items():
        if not pairs[idx[0]][2].is_dense:
            client.put_schedule(name, pairs[idx[0]][2].to_dict())

    def run(name: str) -> list[dict]:
        idx = by_schedule[name]
        sched = pairs[idx[0]][2]
        # SGLang's scheduler resolves names once, at start: a schedule registered since then travels as
        # JSON (which it reads first); the reference server reads the registered name.
        custom = {} if sched.is_dense else {"custom_params": wire.encode_schedule(sched)}
        payload = {"input_ids": [pairs[i][1] for i in idx], "return_logprob": True, "top_logprobs_num": top_k,
                   "sampling_params": [{"max_new_tokens": total_tokens - len(pairs[i][1]), "temperature": 1.0,
                                        "ignore_eos": True, **custom} for i in idx]}
        out = client.generate(payload, schedule=name)
        return out if isinstance(out, list) else [out]

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(by_schedule)) as pool:
        results = dict(zip(by_schedule, pool.map(run, list(by_schedule))))
    gen_s = time.time() - t0
    rows: list[dict] = [{} for _ in pairs]
    for name, idx in by_schedule.items():
        for i, res in zip(idx, results[name]):
            pid, prompt, sched = pairs[i]
            meta = res["meta_info"]
            completion = [int(t) for t in res["output_ids"]]
            rows[i] = {"id": pid, "schedule": json.loads(dump_schedule(sched)), "prompt_ids": prompt,
                       "completion_ids": completion, "logprobs": [float(e[0]) for e in meta["output_token_logprobs"]],
                       "_top": [_parse_top(e, top_k) for e in meta["output_top_logprobs"]]}
    t1 = time.time()
    dense = client.generate({"input_ids": [r["prompt_ids"] + r["completion_ids"] for r in rows],
                             "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}, "return_logprob": True,
                             "logprob_start_len": [len(r["prompt_ids"]) - 1 for r in rows], "top_logprobs_num": top_k},
                            schedule=dense_schedule().name)
    dense = dense if isinstance(dense, list) else [dense]
    for row, res in zip(rows, dense):
        d_ids, d_lps = topk_from_prefill_meta(res["meta_info"], row["completion_ids"], top_k)
        top = row.pop("_top")
        s_ids = torch.tensor([t[0] for t in top], dtype=torch.long)
        s_lps = torch.tensor([t[1] for t in top], dtype=torch.float64)
        row["lower_bound"] = topk_acceptance_lower_bound(s_ids, s_lps, d_ids, d_lps).tolist()
        row["generate_s"], row["dense_prefill_s"] = round(gen_s, 2), round(time.time() - t1, 2)
    return rows


def _quantiles(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), **{k: float(np.quantile(x, q)) for k, q in QUANTILES.items()}, "min": float(x.min()),
            "max": float(x.max()), "mean": float(x.mean())}


def tf_selections(model: Any, ids: torch.Tensor, prompt_len: int, schedule: Schedule,
                  wanted: dict[int, list[int]],
                  landmark_dtype: torch.dtype = torch.float32) -> dict[tuple[int, int], list[np.ndarray]]:
    """The reference's page selections at the wanted (layer -> positions): (layer, position) -> per KV head pages,
    its landmarks stored in ``landmark_dtype`` (a server's SPARROW_LANDMARK_DTYPE) before scoring, in the forward's
    own sparse layers too (their outputs are the later layers' inputs)."""
    from sparrow_server.modeling.sparse_forward import position_budgets, teacher_forced_logits
    from sparrow_server.sparsity.teacher_forced import causal_page_selection

    budgets = position_budgets(schedule, ids.shape[0], prompt_len)
    out: dict[tuple[int, int], list[np.ndarray]] = {}

    def observe(layer: int, q: torch.Tensor, k: torch.Tensor) -> None:
        for t in wanted.get(layer, ()):
            sel = causal_page_selection(q[t:t + 1], k[:t + 1], budgets[t:t + 1].to(q.device), schedule.page_size,
                                        schedule.sink_pages, schedule.recent_pages, query_offset=t,
                                        landmark_dtype=landmark_dtype)[0]
            out[(layer, t)] = [np.sort(h[h >= 0].cpu().numpy()) for h in sel]

    with torch.inference_mode():
        teacher_forced_logits(model, ids, prompt_len, schedule, observe=observe, landmark_dtype=landmark_dtype)
    return out


def _rows_by_prompt_len(rows: list[dict]) -> dict[int, dict]:
    by_plen = {}
    for r in rows:
        if len(r["prompt_ids"]) in by_plen:
            raise ValueError(f"prompt length {len(r['prompt_ids'])} is not unique among the rollouts: generate with "
                             "--distinct-lengths for the selection run")
        by_plen[len(r["prompt_ids"])] = r
    return by_plen


def _reference_pages(model: Any, rows: list[dict], records: dict[str, Any], device: str,
                     landmark_dtype: torch.dtype = torch.float32) -> dict[int, np.ndarray]:
    """The reference's pages for each record index (records of rollouts not in ``rows`` are left out).
    A layer the reference attends densely (a dense layer of the schedule) reads every page."""
    out = {}
    for plen, row in _rows_by_prompt_len(rows).items():
        pick = np.flatnonzero(records["prompt_len"] == plen)
        if pick.size == 0:
            continue
        wanted: dict[int, list[int]] = {}
        for i in pick:
            wanted.setdefault(int(records["layer"][i]), []).append(int(records["length"][i]) - 1)
        ids = torch.tensor(row["prompt_ids"] + row["completion_ids"], device=device)
        sched = schedule_from_dict(row["schedule"])
        ref = tf_selections(model, ids, plen, sched, wanted, landmark_dtype)
        for i in pick:
            layer, t, head = int(records["layer"][i]), int(records["length"][i]) - 1, int(records["head"][i])
            if t < ids.shape[0]:
                out[int(i)] = ref[(layer, t)][head] if (layer, t) in ref else np.arange(-(-(t + 1) // sched.page_size))
    return out


def reference_records(model: Any, rows: list[dict], records: dict[str, Any], device: str,
                      landmark_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """``records`` with each record's pages replaced by ``model``'s selection at the same (token, layer,
    KV head): e.g. the reference run in bf16, whose agreement with the float32 one is what rounding explains."""
    pages = _reference_pages(model, rows, records, device, landmark_dtype)
    keep = np.asarray(sorted(pages), dtype=np.int64)
    return {**{k: np.asarray(v)[keep] for k, v in records.items() if k != "pages"}, "pages": [pages[i] for i in keep]}


def selection_agreement(model: Any, rows: list[dict], records: dict[str, Any], device: str,
                        landmark_dtype: torch.dtype = torch.float32) -> dict:
    """Share of recorded (token, layer, KV head) selections equal to the reference's (its landmarks stored in
    ``landmark_dtype``), and mean Jaccard."""
    equal, jaccard, per_layer = [], [], {}
    for i, expected in _reference_pages(model, rows, records, device, landmark_dtype).items():
        a, b = set(records["pages"][i].tolist()), set(expected.tolist())
        layer = int(records["layer"][i])
        equal.append(a == b)
        jaccard.append(len(a & b) / max(len(a | b), 1))
        per_layer.setdefault(layer, []).append(a == b)
    return {"records": len(equal), "agree_share": float(np.mean(equal)) if equal else None,
            "mean_jaccard": float(np.mean(jaccard)) if jaccard else None,
            "agree_share_by_layer": {str(k): float(np.mean(v)) for k, v in sorted(per_layer.items())}}


def oracle_rollout(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int], schedule: Schedule,
                   scorer: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The float32 oracle on one rollout: the reference teacher-forced sparse forward under ``schedule`` and the
    plain dense forward on the same tokens. Returns (exact acceptance at temperature 1 of every generated token,
    the reference logprob of each sampled token), both [N] float64 on the CPU."""
    from sparrow_server.modeling.sparse_forward import teacher_forced_logits
    from sparrow_server.monitor.scoring import HFScorer, chunked_exact_acceptance

    scorer, device = scorer or HFScorer(model), next(model.parameters()).device
    p, c = list(prompt_ids), list(completion_ids)
    ids = torch.tensor((p + c)[:-1], device=device)
    with torch.inference_mode():
        sparse = (scorer.dense_logits(p, c) if schedule.is_dense
                  else teacher_forced_logits(model, ids, len(p), schedule)[len(p) - 1:])
        dense = scorer.dense_logits(p, c)
        ref_lp = torch.log_softmax(sparse, dim=-1).gather(1, torch.tensor(c, device=device)[:, None])[:, 0]
        exact = chunked_exact_acceptance(sparse, dense, 1.0)
    del sparse, dense
    return exact, ref_lp.double().cpu().numpy()


def score(model: Any, rows: list[dict], bin_tokens: int, tokens_out: Path | None = None) -> dict:
    """Per schedule: |server - reference| logprob of the sampled tokens, exact acceptance vs the lower bound per bin.
    ``tokens_out``: also save the per-token arrays (``<schedule>/<array>``, ``length`` = tokens attended) as npz."""
    from sparrow_server.monitor.scoring import HFScorer

    scorer = HFScorer(model)
    per: dict[str, dict[str, list[np.ndarray]]] = {}
    for row in rows:
        sched = schedule_from_dict(row["schedule"])
        p, c = row["prompt_ids"], row["completion_ids"]
        exact, ref_lp = oracle_rollout(model, p, c, sched, scorer)
        acc = per.setdefault(sched.name, {"diff": [], "exact": [], "lower": [], "length": []})
        acc["diff"].append(np.abs(np.asarray(row["logprobs"]) - ref_lp))
        acc["exact"].append(exact)
        acc["lower"].append(np.asarray(row["lower_bound"]))
        acc["length"].append(len(p) + np.arange(len(c)))
    out, arrays = {}, {}
    for name, acc in per.items():
        d, ex, lb, ln = (np.concatenate(acc[k]) for k in ("diff", "exact", "lower", "length"))
        rollout = np.concatenate([np.full(len(x), i) for i, x in enumerate(acc["diff"])])
        arrays.update({f"{name}/abs_logprob_diff": d.astype(np.float32), f"{name}/exact": ex.astype(np.float32),
                       f"{name}/lower_bound": lb.astype(np.float32), f"{name}/length": ln, f"{name}/rollout": rollout})
        bins = []
        for b in range(int(ln.max()) // bin_tokens + 1):
            m = (ln // bin_tokens) == b
            if m.any():
                bins.append({"bin": b, "from": b * bin_tokens, "tokens": int(m.sum()),
                             "exact_mean": float(ex[m].mean()), "exact_p5": float(np.quantile(ex[m], 0.05)),
                             "lower_mean": float(lb[m].mean()), "lower_p5": float(np.quantile(lb[m], 0.05)),
                             "mean_gap": float((ex[m] - lb[m]).mean()),
                             "lower_above_exact_share": float((lb[m] > ex[m] + 1e-3).mean())})
        out[name] = {"rollouts": len(acc["diff"]), "tokens": int(d.size), "abs_logprob_diff": _quantiles(d),
                     "exact": _quantiles(ex), "lower_bound": _quantiles(lb), "bins": bins}
    if tokens_out is not None:
        np.savez_compressed(tokens_out, **arrays)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--server", required=True)
    g.add_argument("--model", type=Path, default=None, help="HF directory (its tokenizer formats text prompts)")
    g.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    g.add_argument("--budgets", default="256,512,1024")
    g.add_argument("--dense", action="store_true", help="also roll out with the dense schedule (the bf16 floor)")
    g.add_argument("--total-tokens", type=int, default=8192, help="prompt + generated tokens per rollout")
    g.add_argument("--prompts-per-schedule", type=int, default=4)
    g.add_argument("--distinct-lengths", action="store_true", help="one prompt length per rollout (selection runs)")
    g.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score")
    s.add_argument("--rollouts", type=Path, required=True)
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--device", default="cpu")
    s.add_argument("--bin-tokens", type=int, default=1024)
    s.add_argument("--selections", type=Path, default=None, help="the debug hook's folder")
    s.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from sparrow_server.models import load_model

    if args.cmd == "generate":
        from sparrow_server.client import SparrowClient

        tokenizer = tokenizer_of(args.model)
        schedules = [fixed_schedule(int(b)) for b in args.budgets.split(",") if b.strip()]
        schedules += [dense_schedule()] if args.dense else []
        pairs = assign(load_prompts(args.prompts, tokenizer), schedules, args.prompts_per_schedule,
                       args.distinct_lengths)
        with SparrowClient(args.server, timeout=1800) as client:
            rows = generate(client, pairs, args.total_tokens)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(json.dumps({"rollouts": len(rows), "tokens": sum(len(r["completion_ids"]) for r in rows),
                          "generate_s": rows[0]["generate_s"], "dense_prefill_s": rows[0]["dense_prefill_s"]}))
        return 0
    rows = [json.loads(line) for line in args.rollouts.read_text().splitlines() if line.strip()]
    model = load_model(args.model, device=args.device).model
    t0 = time.time()
    result = {"rollouts": str(args.rollouts), "model": str(args.model), "device": args.device, "dtype": "float32",
              "bin_tokens": args.bin_tokens,
              "schedules": score(model, rows, args.bin_tokens, args.out.with_suffix(".tokens.npz"))}
    if args.selections is not None:
        from sparrow_server.sglang_plugin.scheduler.selection_debug import load_records

        result["selections"] = selection_agreement(model, rows, load_records(args.selections), args.device)
    result["score_s"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: {"abs_logprob_diff": v["abs_logprob_diff"], "exact_mean": v["exact"].get("mean"),
                          "lower_mean": v["lower_bound"].get("mean")} for k, v in result["schedules"].items()}, indent=1))
    if "selections" in result:
        print(json.dumps({k: v for k, v in result["selections"].items() if k != "agree_share_by_layer"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
