"""Issue 25 item 1, CPU study, step 2: per length bin, the p5 each estimator gives against the exact p5.

Reads ``tail_estimators.py``'s ``<work>/*.npz`` and writes ``tail_estimators.json`` and ``tables.md``:

- per (budget, bin): exact p5; per K and design (``2``: two top-K lists; ``f``: sparse top-K vs the
  full dense distribution), the bracket ``[p5(lower), p5(upper)]`` (it contains the exact p5: a quantile
  is monotone), its midpoint, the p5 of the per-token midpoints ``(lower + upper) / 2`` and of the
  per-token residual estimate ``cv``, and the p5 of the plain
  sampled-token ratio ``w``;
- per (design, K): the largest error of each over all bins, and the bytes per verified token it costs;
- the exact-on-a-subsample alternative: the 95% spread of a bin's p5 from ``m`` exact tokens.

Every bracket is checked to contain the exact p5 (an assertion).

    PYTHONPATH=. python benchmarks/fidelity/tail_estimators_report.py --work /tmp/tail-work \\
        --storage-work /tmp/tail-storage --out benchmarks/results/fidelity/tail_estimators
"""
from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import numpy as np

from sparrow_server.stats.tail import binned_quantile_brackets, binned_quantiles

Q = 0.05
TOL = 0.02
DESIGNS = {"2": "two top-K lists", "f": "sparse top-K vs full dense (GPU)"}
SUBSAMPLES = (256, 512, 1024, 2048, 4096)
VOCAB = 49152


def load(work: Path) -> dict[int, dict[str, np.ndarray]]:
    """{budget: {column: pooled [N]}} over every rollout's file."""
    pooled: dict[int, dict[str, list]] = {}
    for path in sorted(work.glob("*__fixed-*.npz")):
        budget = int(path.stem.split("fixed-")[1])
        with np.load(path) as f:
            for name in f.files:
                pooled.setdefault(budget, {}).setdefault(name, []).append(f[name])
    return {b: {n: np.concatenate(v) for n, v in cols.items()} for b, cols in sorted(pooled.items())}


def ks_of(cols: dict[str, np.ndarray]) -> list[int]:
    return sorted(int(n.split("_k")[1]) for n in cols if n.startswith("lo2_k"))


def p5_by_bin(values: np.ndarray, positions: np.ndarray, bin_tokens: int) -> list[float]:
    return [b.quantile for b in binned_quantiles(values, positions, bin_tokens, Q, n_boot=0)]


def bin_rows(budget: int, cols: dict[str, np.ndarray], bin_tokens: int) -> list[dict]:
    """One row per length bin: exact p5 and every estimator's p5."""
    pos = cols["position"]
    exact = binned_quantiles(cols["exact"], pos, bin_tokens, Q, n_boot=0)
    rows = [{"budget": budget, "bin_from": e.bin_index * bin_tokens, "tokens": e.n_tokens, "exact_p5": e.quantile,
             "exact_mean": e.mean} for e in exact]
    for row, w in zip(rows, p5_by_bin(cols["w"], pos, bin_tokens)):
        row["w_p5"] = w
    for k in ks_of(cols):
        for d in DESIGNS:
            brackets = binned_quantile_brackets(cols[f"lo{d}_k{k}"], cols[f"up{d}_k{k}"], pos, bin_tokens, Q)
            cv = p5_by_bin(cols[f"cv{d}_k{k}"], pos, bin_tokens)
            token_mid = p5_by_bin((cols[f"lo{d}_k{k}"] + cols[f"up{d}_k{k}"]) / 2, pos, bin_tokens)
            for row, br, c, tm in zip(rows, brackets, cv, token_mid):
                assert br.low <= row["exact_p5"] + 1e-9 and row["exact_p5"] <= br.high + 1e-9, (budget, k, d, br)
                row[f"{d}_k{k}"] = {"lo_p5": br.low, "up_p5": br.high, "mid": br.mid, "token_mid_p5": tm, "cv_p5": c}
    return rows


def worst_errors(rows: list[dict], ks: list[int]) -> list[dict]:
    """Per (design, K): the largest |error| over all (budget, bin) of each estimate of the p5."""
    out = []
    for d, label in DESIGNS.items():
        for k in ks:
            cells = [(r[f"{d}_k{k}"], r["exact_p5"]) for r in rows]
            err = {name: max(abs(c[key] - e) for c, e in cells)
                   for name, key in (("lower", "lo_p5"), ("upper", "up_p5"), ("mid", "mid"),
                                 ("token_mid", "token_mid_p5"), ("cv", "cv_p5"))}
            half = max((c["up_p5"] - c["lo_p5"]) / 2 for c, _ in cells)
            out.append({"design": d, "label": label, "k": k, **{f"max_err_{n}": v for n, v in err.items()},
                        "max_half_width": half, "mid_within_tol": err["mid"] <= TOL,
                        "guaranteed_within_tol": half <= TOL, **wire_bytes(d, k)})
    worst_w = max(abs(r["w_p5"] - r["exact_p5"]) for r in rows)
    out.append({"design": "w", "label": "sampled-token ratio only", "k": 0, "max_err_w": worst_w,
                "mid_within_tol": worst_w <= TOL, **wire_bytes("w", 0)})
    return out


def _topk_entry_lists(k: int, seed: int = 0) -> tuple[list[float], list[int]]:
    rng = np.random.default_rng(seed)
    return (np.sort(np.log(rng.dirichlet(np.ones(VOCAB)))[:k])[::-1].tolist(),
            rng.choice(VOCAB, size=k, replace=False).tolist())


def wire_bytes(design: str, k: int) -> dict:
    """Bytes per verified token beyond the sampled token's two logprobs (which every design has).

    ``packed``: int32 id + float32 logprob per entry. ``pickle``: SGLang's scheduler -> detokenizer
    form (a list of logprob floats and a list of ids per token, pickled). ``json``: the
    ``meta_info`` form ``[[logprob, id, null], ...]``. Design ``2`` ships both lists to the host;
    design ``f`` ships the sparse list to the host at decode and back to the GPU in the verify
    request, and two floats (the bounds) back.
    """
    if design == "w":
        return {"bytes_packed": 0, "bytes_pickle": 0, "bytes_json": 0}
    vals, ids = _topk_entry_lists(k)
    one = {"bytes_packed": 8 * k, "bytes_pickle": len(pickle.dumps(vals)) + len(pickle.dumps(ids)),
           "bytes_json": len(json.dumps([[v, i, None] for v, i in zip(vals, ids)]))}
    return {name: 2 * v + (8 if design == "f" else 0) for name, v in one.items()}


def subsample_spread(budgets: dict, bin_tokens: int, reps: int = 400, seed: int = 0) -> list[dict]:
    """Half the 95% range of a bin's p5 from m exact tokens, worst bin.

    Drawn with replacement from the bin's tokens: the bin's empirical distribution stands for the
    population of a production bin (many requests), so m may exceed the bin's own token count."""
    rng = np.random.default_rng(seed)
    out = []
    for budget, cols in budgets.items():
        bins = cols["position"] // bin_tokens
        for m in SUBSAMPLES:
            worst = 0.0
            for b in np.unique(bins):
                vals = cols["exact"][bins == b]
                draws = np.quantile(vals[rng.integers(0, vals.size, (reps, m))], Q, axis=1)
                lo, hi = np.quantile(draws, [0.025, 0.975])
                worst = max(worst, (hi - lo) / 2)
            out.append({"budget": budget, "m": m, "worst_half_range_95": worst})
    return out


def markdown(rows: list[dict], worst: list[dict], spread: list[dict], ks: list[int]) -> str:
    lines = ["| budget | bin from | tokens | exact p5 | w p5 | " + " | ".join(
        f"{d}K{k} [lo, up] mid / cv" for d in DESIGNS for k in ks) + " |",
        "|" + "---|" * (5 + len(DESIGNS) * len(ks))]
    for r in rows:
        cells = [f"[{r[f'{d}_k{k}']['lo_p5']:.3f}, {r[f'{d}_k{k}']['up_p5']:.3f}] {r[f'{d}_k{k}']['mid']:.3f} / "
                 f"{r[f'{d}_k{k}']['cv_p5']:.3f}" for d in DESIGNS for k in ks]
        lines.append(f"| {r['budget']} | {r['bin_from']} | {r['tokens']} | {r['exact_p5']:.3f} | {r['w_p5']:.3f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| design | K | max err p5(lower) | max err p5(upper) | max err bracket mid | max half-width | "
              "max err p5((lo+up)/2) | max err p5(cv) | mid within ±0.02 | bytes/token packed | pickle | JSON |",
              "|" + "---|" * 12]
    for w in worst:
        if w["design"] == "w":
            lines.append(f"| {w['label']} | – | – | – | – | – | – | {w['max_err_w']:.3f} (p5 of w) | "
                         f"{'yes' if w['mid_within_tol'] else 'no'} | 0 | 0 | 0 |")
            continue
        lines.append(f"| {w['label']} | {w['k']} | {w['max_err_lower']:.3f} | {w['max_err_upper']:.3f} | "
                     f"{w['max_err_mid']:.3f} | {w['max_half_width']:.3f} | {w['max_err_token_mid']:.3f} | "
                     f"{w['max_err_cv']:.3f} | "
                     f"{'yes' if w['mid_within_tol'] else 'no'} | {w['bytes_packed']} | {w['bytes_pickle']} | "
                     f"{w['bytes_json']} |")
    lines += ["", "| budget | exact tokens per bin (m) | worst bin's 95% half-range of p5 |", "|---|---|---|"]
    lines += [f"| {s['budget']} | {s['m']} | {s['worst_half_range_95']:.3f} |" for s in spread]
    return "\n".join(lines) + "\n"


def storage_check(work: Path) -> list[dict]:
    """``tail_estimators.py --storage`` files: exact acceptance from 16-bit sparse rows vs float32."""
    out = []
    for path in sorted(work.glob("*__storage.npz")):
        with np.load(path) as f:
            exact = f["exact"]
            for name in ("fp16max", "bf16"):
                err = np.abs(f[f"exact_{name}"] - exact)
                out.append({"file": path.name, "row": name, "tokens": int(exact.size), "max_abs_err": float(err.max()),
                            "mean_abs_err": float(err.mean()), "p5_exact": float(np.quantile(exact, Q)),
                            "p5_stored": float(np.quantile(f[f"exact_{name}"], Q))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bin-tokens", type=int, default=512)
    parser.add_argument("--storage-work", type=Path, default=None, help="the --work of a --storage run")
    args = parser.parse_args()
    budgets = load(args.work)
    ks = ks_of(next(iter(budgets.values())))
    rows = [row for b, cols in budgets.items() for row in bin_rows(b, cols, args.bin_tokens)]
    worst = worst_errors(rows, ks)
    spread = subsample_spread(budgets, args.bin_tokens)
    means = {b: {"exact": float(c["exact"].mean()), "w": float(c["w"].mean()), "tokens": int(c["exact"].size)}
             for b, c in budgets.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"q": Q, "tolerance": TOL, "bin_tokens": args.bin_tokens, "ks": ks, "designs": DESIGNS,
              "means": means, "bins": rows, "worst": worst, "subsample_exact": spread,
              "storage": storage_check(args.storage_work) if args.storage_work else []}
    (args.out / "tail_estimators.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "tables.md").write_text(markdown(rows, worst, spread, ks))
    print(markdown(rows, worst, spread, ks))
    print(json.dumps(means))
    for row in report["storage"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
