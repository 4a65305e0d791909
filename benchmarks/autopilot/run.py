"""Autopilot demonstration on the embedded model (CPU): two copies of a schedule, one far too tight and
one far too loose, steered live by the server's autopilot while rollouts run with sampled dense
verification. Writes ``autopilot.json`` (every snapshot: version, budgets, per-bin evidence) and the
rollouts' lengths, then ``report`` turns it into plots and the attended-token cost comparison
(``kv_budget_tokens`` per decode step, the engines' own count). With ``--start-budgets`` one schedule
starts from given budgets, for a weight update (``--weights``) or, with ``--publish-adapter``, a
DistillSparse adapter published mid-run next to a control schedule that never uses it.

    PYTHONPATH=. python benchmarks/autopilot/run.py run --out benchmarks/results/autopilot --minutes 28
    PYTHONPATH=. python benchmarks/autopilot/run.py report --out benchmarks/results/autopilot
    (the weight-update and DistillSparse commands: benchmarks/results/autopilot/README.md)
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "benchmarks" / "fidelity" / "prompts.jsonl"
OFFLINE = REPO / "benchmarks" / "results" / "fidelity" / "fine" / "calibrated_schedule.json"
BIN, PAGE = 64, 16
BASE = {"bin_tokens": BIN, "page_size": PAGE, "dense_layers": [0, 1], "threshold": 0.89}
TIGHT, LOOSE = "ap-tight", "ap-loose"
DISTILL, CONTROL = "ap-distill", "ap-control"  # served with the published adapter / never with it
ALIAS = "distill-latest"  # the alias `sparrow-server distill --publish` moves


def starts(n_bins: int, loose_tokens: int) -> dict[str, list[int]]:
    """The smallest valid budget everywhere (far too tight), and a budget dense for most lengths (far too loose)."""
    return {TIGHT: [64] * n_bins, LOOSE: [loose_tokens] * n_bins}


def pilot_config(args) -> dict:
    return {"target": args.target, "margin": args.margin, "min_tokens": args.min_tokens, "confidence": args.confidence,
            "ceiling_tokens": args.ceiling}


def plan_of(args) -> dict[str, list[int]]:
    """The steered schedules and their start budgets."""
    if not args.start_budgets:
        plan = starts(args.bins, args.loose_tokens)
        return {name: plan[name] for name in (args.only or plan)}
    budgets = [int(b) for b in args.start_budgets.split(",")]
    if args.publish_adapter:  # the adapter's schedule, and a copy never served with it (the control)
        return {DISTILL: budgets, CONTROL: list(budgets)}
    return {"ap-weights": budgets}  # one schedule from given budgets (e.g. a converged one): the weight-update run


def load_prompts(split: str) -> list[str]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows if split == "all" or r["split"] == split]


def run(args) -> int:
    sys.path.insert(0, str(REPO))
    from sparrow_server.commands.demo import free_port, wait_healthy

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(args.prompt_split)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix="sparrow-autopilot-")
    cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference", "--device", "cpu",
           "--port", str(port), "--state-dir", state, "--log-level", "warning", "--threads", str(args.threads),
           "--verify-fraction", str(args.verify_fraction), "--max-batch-size", str(2 * args.concurrency)]
    if args.publish_adapter:
        cmd += ["--adapter-root", str(Path(args.publish_adapter).resolve().parent)]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO)})
    snapshots, rollouts, lock = [], [], threading.Lock()
    plan = plan_of(args)
    events = {"weights_updated_at": None, "adapter_published_at": None}
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    try:
        wait_healthy(url, proc)
        http = httpx.Client(base_url=url, timeout=1800)
        for name, budgets in plan.items():
            http.put(f"/schedules/{name}", json={**BASE, "budgets_tokens": budgets}).raise_for_status()
            http.put(f"/schedules/{name}/autopilot", json=pilot_config(args)).raise_for_status()
        seeds = itertools.count()

        def worker(name: str) -> None:
            while time.monotonic() < deadline:
                seed = next(seeds)
                body = {"text": prompts[seed % len(prompts)], "apply_chat_template": True, "schedule": name,
                        "sampling_params": {"max_new_tokens": args.new_tokens, "temperature": 1.0, "seed": seed,
                                            "ignore_eos": True}}
                if name == DISTILL and events["adapter_published_at"] is not None:
                    body["adapter"] = ALIAS  # resolved to its version at admission
                r = http.post("/rollout", json=body)
                r.raise_for_status()
                res = r.json()
                with lock:
                    rollouts.append({"t": time.monotonic() - started, "schedule": name,
                                     "schedule_id": res["meta"]["schedule_id"], "adapter": body.get("adapter"),
                                     "prompt_tokens": res["meta"].get("prompt_tokens"),
                                     "kv_budget_tokens": res["kv_budget_tokens"]})

        threads = [threading.Thread(target=worker, args=(name,), daemon=True)
                   for name in plan for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        while time.monotonic() < deadline:
            time.sleep(args.snapshot_s)
            _events(args, url, http, events, time.monotonic() - started)
            snap = {"t": time.monotonic() - started, **events}
            for name in plan:
                snap[name] = http.get(f"/schedules/{name}/autopilot").json()
            with lock:
                snap["rollouts_done"] = len(rollouts)
            snapshots.append(snap)
            brief = {n: (snap[n]["version"], snap[n]["budgets_tokens"]) for n in plan}
            print(f"[{snap['t']:6.0f} s] rollouts {snap['rollouts_done']}: {brief}", flush=True)
            _save(out, args, plan, snapshots, rollouts, http)
        for t in threads:
            t.join()
        _save(out, args, plan, snapshots, rollouts, http)
        # The server's verified rollouts (its last EVIDENCE_RECORDS), for the report's p5 at the final budgets.
        (out / "evidence.json").write_text(json.dumps(http.get("/autopilot/evidence").json()) + "\n")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 0


def _events(args, url: str, http, events: dict, now_s: float) -> None:
    """The run's one-off events, once their minute has come: a weight update, an adapter published."""
    if args.weights and events["weights_updated_at"] is None and now_s >= 60 * args.update_at_min:
        r = http.post("/update_weights_from_disk", json={"model_path": args.weights, "weight_version": "perturbed"})
        print(f"weight update: {r.status_code} {r.text[:300]}", flush=True)
        r.raise_for_status()
        events["weights_updated_at"] = now_s
    if args.publish_adapter and events["adapter_published_at"] is None and now_s >= 60 * args.publish_at_min:
        from sparrow_server.distill.publish import publish

        path = Path(args.publish_adapter).resolve()
        for p in publish([url], path.name, str(path), ALIAS):  # what `sparrow-server distill --publish` does
            print(f"published {p.name} on {p.server} as {p.alias!r}", flush=True)
        events["adapter_published_at"] = now_s


def _save(out: Path, args, plan, snapshots, rollouts, http) -> None:
    history = {n: http.get(f"/schedules/{n}/history").json() for n in plan}
    data = {"command": " ".join(sys.argv), "config": pilot_config(args), "verify_fraction": args.verify_fraction,
            "new_tokens": args.new_tokens, "concurrency_per_schedule": args.concurrency, "starts": plan,
            "snapshots": snapshots, "history": history, "rollouts": rollouts}
    (out / "autopilot.json").write_text(json.dumps(data) + "\n")


def decode_lengths(rollouts: list[dict]) -> list[int]:
    """KV length of every decode step of every rollout: token j >= 1 is decoded at prompt + j tokens (token 0
    comes from the prefill, which attends the prompt densely and has no ``kv_budget_tokens``)."""
    return [r["prompt_tokens"] + j for r in rollouts for j in range(1, len(r["kv_budget_tokens"]))]


def attended_cost(schedule, lengths: list[int]) -> float:
    """Mean KV tokens a sparse layer attends per decode step under ``schedule``: the project's one definition,
    ``kv_budget_tokens`` (the value the engines report per token), at each of ``lengths``."""
    from sparrow_server.sparsity.schedule import kv_budget_tokens

    return sum(kv_budget_tokens(schedule, n) for n in lengths) / len(lengths)


def version_schedule(history: dict, version: int):
    from sparrow_server.sparsity.schedule import schedule_from_dict

    return schedule_from_dict(next(v["schedule"] for v in history["versions"] if v["version"] == version))


def recount_mismatches(data: dict) -> int:
    """Decode steps whose reported ``kv_budget_tokens`` differs from ``kv_budget_tokens`` recomputed under the
    schedule version the rollout ran on (0: the cost column counts what the server attended)."""
    from sparrow_server.sparsity.schedule import kv_budget_tokens

    bad = 0
    for r in data["rollouts"]:
        name, version = r["schedule_id"].rsplit("@", 1)
        schedule = version_schedule(data["history"][name], int(version))
        bad += sum(kv_budget_tokens(schedule, r["prompt_tokens"] + j) != reported
                   for j, reported in enumerate(r["kv_budget_tokens"]) if j)
    return bad


def bin_values(records: list[dict], name: str, b: int, n_bins: int, keep) -> list[float]:
    """Acceptance of every token verified in bin ``b`` of schedule ``name``, from the records ``keep`` accepts."""
    return [a for r in records if r["schedule"] == name and keep(r)
            for a, n in zip(r["acceptance"], r["basis_lengths"]) if min(n // BIN, n_bins - 1) == b]


def p5_of(values: list[float], cfg: dict) -> dict | None:
    import numpy as np

    from sparrow_server.autopilot.controller import DEFAULT_QUANTILE, quantile_interval

    if not values:
        return None
    p5, low, high = quantile_interval(np.asarray(values), DEFAULT_QUANTILE, cfg["confidence"])
    return {"n_tokens": len(values), "p5": p5, "p5_low": low, "p5_high": high}


def final_budget_p5(records: list[dict], name: str, budgets: list[int], b: int, cfg: dict) -> dict | None:
    """p5 and interval of every token verified in bin ``b`` while it ran at its final budget (any schedule
    version) under the schedule's final policy (the weights and adapter of its last verified rollout)."""
    own = [r for r in records if r["schedule"] == name]
    if not own:
        return None
    policy = (own[-1]["weight_version"], own[-1].get("adapter"))
    values = bin_values(own, name, b, len(budgets), lambda r: r["budgets_tokens"][b] == budgets[b]
                        and (r["weight_version"], r.get("adapter")) == policy)
    found = p5_of(values, cfg)
    return None if found is None else {"budget_tokens": budgets[b], **found}


def p5_by_policy(records: list[dict], name: str, n_bins: int, cfg: dict) -> list[dict]:
    """Per bin, adapter and budget: the p5 of every token verified there (the adapter's gain at a budget is the
    difference between its rows and the adapter-less ones at the same budget)."""
    groups = sorted({(b, r.get("adapter") or "", r["budgets_tokens"][b]) for r in records if r["schedule"] == name
                     for b in range(n_bins)})
    rows = []
    for b, adapter, budget in groups:
        values = bin_values(records, name, b, n_bins,
                            lambda r: (r.get("adapter") or "") == adapter and r["budgets_tokens"][b] == budget)
        if values:
            rows.append({"bin": b, "adapter": adapter or None, "budget_tokens": budget, **p5_of(values, cfg)})
    return rows


EVENTS = {"weights_updated_at": "weight update", "adapter_published_at": "adapter published"}


def report(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(REPO))
    from sparrow_server.sparsity.schedule import load_schedule

    out = Path(args.out)
    data = json.loads((out / "autopilot.json").read_text())
    plan = data["starts"]
    n_bins = len(next(iter(plan.values())))
    cfg = data["config"]
    target, margin = cfg["target"], cfg["margin"]
    # The server's verified rollouts (GET /autopilot/evidence, saved while the run was alive), if kept.
    evidence_path = out / "evidence.json"
    evidence = json.loads(evidence_path.read_text())["records"] if evidence_path.exists() else None
    offline_schedule = load_schedule(OFFLINE)
    offline = list(offline_schedule.budgets_tokens)
    lengths = decode_lengths(data["rollouts"])  # every row's cost is over the same decode steps
    summary = {"target": target, "band": [target - 0.02, target + margin], "offline_schedule": offline,
               "offline_cost": attended_cost(offline_schedule, lengths), "decode_steps": len(lengths),
               "reported_vs_kv_budget_tokens_mismatches": recount_mismatches(data), "schedules": {}}
    fig, axes = plt.subplots(2, len(plan), figsize=(6 * len(plan) + 1, 8), sharex=True, squeeze=False)
    events = {label: next((s[key] for s in data["snapshots"] if s.get(key)), None) for key, label in EVENTS.items()}
    for col, name in enumerate(plan):
        snaps = [s for s in data["snapshots"] if name in s]
        final = snaps[-1][name]
        bins = _plot_schedule(axes[0][col], axes[1][col], name, snaps, offline, target, margin)
        if evidence is not None:
            for b, row in enumerate(bins):
                row["at_final_budget"] = final_budget_p5(evidence, name, final["budgets_tokens"], b, cfg)
        summary["schedules"][name] = {
            "start": data["starts"][name], "final_version": final["version"], "final_budgets": final["budgets_tokens"],
            "start_cost": attended_cost(version_schedule(data["history"][name], 1), lengths),
            "cost": attended_cost(version_schedule(data["history"][name], final["version"]), lengths), "bins": bins,
            "versions": len(data["history"][name]["versions"])}
        if evidence is not None and DISTILL in plan:
            summary["schedules"][name]["p5_by_adapter_and_budget"] = p5_by_policy(evidence, name, n_bins, cfg)
        for label, at in events.items():
            if at is None:
                continue
            for row_axes in axes:
                row_axes[col].axvline(at / 60, color="k", linewidth=1)
            axes[0][col].annotate(label, (at / 60, axes[0][col].get_ylim()[1]), fontsize=8,
                                  xytext=(3, -12), textcoords="offset points")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "autopilot_convergence.png", dpi=110)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def _plot_schedule(top, bottom, name: str, snaps: list[dict], offline: list[int], target: float,
                   margin: float) -> list[dict]:
    """Budget and window p5 per bin over time (top, bottom axes); returns the final bins' rows of the summary."""
    t = [s["t"] / 60 for s in snaps]
    final = snaps[-1][name]
    bins = []
    for b in range(len(final["budgets_tokens"])):
        budgets = [s[name]["budgets_tokens"][b] for s in snaps]
        p5 = [(s[name]["bins"][b]["evidence"] or {}).get("p5") for s in snaps]
        line, = top.step(t, budgets, where="post", label=f"bin {b}")
        top.axhline(offline[min(b, len(offline) - 1)], color=line.get_color(), linestyle=":", linewidth=1)
        bottom.plot(t, [v if v is not None else float("nan") for v in p5], marker=".", label=f"bin {b}")
        ev = final["bins"][b]["evidence"]
        bins.append({"bin": b, "budget_tokens": final["budgets_tokens"][b], "evidence": ev,
                     "in_band": ev is not None and target - 0.02 <= ev["p5"] <= target + margin,
                     "at_floor": final["budgets_tokens"][b] == final["floor_tokens"]})
    top.set_title(f"{name}: budget per 64-token bin (dotted: offline-calibrated)")
    top.set_ylabel("KV budget (tokens)")
    bottom.axhspan(target - 0.02, target + margin, color="green", alpha=0.15, label="band")
    bottom.axhline(target, color="red", linestyle="--", label="target")
    bottom.set_ylim(0.5, 1.01)
    bottom.set_ylabel("p5 of the evidence window")
    bottom.set_xlabel("minutes")
    return bins


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--minutes", type=float, default=28)
    r.add_argument("--target", type=float, default=0.89)
    r.add_argument("--margin", type=float, default=0.03)
    r.add_argument("--min-tokens", type=int, default=128)
    r.add_argument("--confidence", type=float, default=0.8)
    r.add_argument("--ceiling", type=int, default=384)
    r.add_argument("--verify-fraction", type=float, default=0.5)
    r.add_argument("--new-tokens", type=int, default=192)
    r.add_argument("--bins", type=int, default=4, help="64-token length bins of the steered schedules")
    r.add_argument("--loose-tokens", type=int, default=256, help="the far-too-loose start's budget in every bin")
    r.add_argument("--concurrency", type=int, default=6, help="rollouts in flight per schedule")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--snapshot-s", type=float, default=30)
    r.add_argument("--only", choices=(TIGHT, LOOSE), nargs="+", default=None,
                   help="steer only these of the two default starts (the other's rollouts then leave it the CPU)")
    r.add_argument("--start-budgets", default=None, help="steer one schedule from these budgets instead")
    r.add_argument("--weights", default=None, help="a checkpoint to update the weights to during the run")
    r.add_argument("--update-at-min", type=float, default=3.0)
    r.add_argument("--publish-adapter", default=None, metavar="DIR",
                   help=f"with --start-budgets: publish this DistillSparse adapter during the run; {DISTILL} is then "
                        f"served with it, {CONTROL} (same start) without")
    r.add_argument("--publish-at-min", type=float, default=5.0)
    r.add_argument("--prompt-split", choices=("all", "calibration", "heldout"), default="all",
                   help="which prompts of benchmarks/fidelity/prompts.jsonl the rollouts use")
    r.set_defaults(func=run)
    s = sub.add_parser("report")
    s.add_argument("--out", required=True)
    s.set_defaults(func=report)
    args = p.parse_args()
    if args.cmd == "run" and args.only and args.start_budgets:
        p.error("--only picks among the default starts; it does not combine with --start-budgets")
    if args.cmd == "run" and args.publish_adapter and not args.start_budgets:
        p.error("--publish-adapter needs --start-budgets (the budgets the adapter was trained for)")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
