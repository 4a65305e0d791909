"""``nccl`` part (GPU only): SGLang's NCCL weight path from a stand-in trainer (this process, GPU 1)
to server 0, checked against server 1 updated from disk with the same weights.

1. Idle update A -> B: per-engine weight checksums equal (bit-equal weights); greedy rollouts (sparse
   and dense) agree with the tolerance bf16 explains (``sparrow_server.stats.greedy_agreement``), token
   equality recorded, each server against itself on a second pass recorded (where it parts from
   itself, ties and not the update part the two servers; run 1 showed exactly that).
2. Update B -> C while sparse rollouts stream on server 0, the way slime does it:
   ``pause_generation`` -> ``update_weights_from_distributed`` -> ``continue_generation``. Pause mode
   ``retract``: running requests go back to the queue and their KV is recomputed with the new
   weights after ``continue``; ``abort`` (SGLang's default) would end the streams, and ``in_place``
   would keep their old-weight KV and landmarks. SGLang asserts that the cache flush after an
   update succeeds, and a flush fails while requests are queued, so the update is sent with
   ``flush_cache: false`` (the radix cache is off: there is no cached prefix to go stale). Every
   stream must end with all its tokens and no error; afterwards server 0 (``nccl-step-2``) and
   server 1 (C from disk) agree on the same greedy rollouts, sparse and dense, as in 1.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import sglang_server as S
from fleet_gpu.common import DENSE, SPARSE, Fleet, post, prompts, rollout, sampling
from sparrow_server.stats.greedy_agreement import agreement_problems, run_from_rollouts

NCCL_PORT = 29611
PAUSE_MODE = "retract"
COMPARE_PROMPTS, COMPARE_LEN = 4, 1200


class Trainer:
    """This process as rank 0 of an NCCL group with server 0 (rank 1), on GPU 1."""

    def __init__(self, base: str, port: int = NCCL_PORT):
        import torch
        from sglang.srt.utils.common import init_custom_process_group

        self.base = base
        self.name = f"sparrow-trainer-{int(time.time())}"  # a group name is never reused by a server
        group = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                 "group_name": self.name, "backend": "nccl"}
        reply, server_side = _in_thread(lambda: post(base, "/init_weights_update_group", group, 120))
        torch.cuda.set_device(1)
        self.pg = init_custom_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2,
                                            rank=0, group_name=self.name)
        server_side.join(125)
        assert reply.get("success"), reply

    def send(self, weights: Path, version: str, flush_cache: bool = True, timeout_s: float = 120) -> tuple[dict, float, int]:
        """Broadcast every tensor of ``weights`` while server 0 receives them; (reply, seconds, tensors)."""
        import torch
        from safetensors.torch import load_file

        tensors = {k: v.to("cuda:1") for k, v in load_file(str(weights / "model.safetensors")).items()}
        names = sorted(tensors)
        body = {"names": names, "dtypes": [str(tensors[n].dtype).replace("torch.", "") for n in names],
                "shapes": [list(tensors[n].shape) for n in names], "group_name": self.name,
                "weight_version": version, "flush_cache": flush_cache}
        t0 = time.time()
        reply, server_side = _in_thread(lambda: post(self.base, "/update_weights_from_distributed", body, timeout_s))
        for n in names:
            torch.distributed.broadcast(tensors[n], src=0, group=self.pg)
        server_side.join(timeout_s + 5)
        return reply, time.time() - t0, len(names)


def _in_thread(call) -> tuple[dict, threading.Thread]:
    """Run an HTTP call beside the trainer's NCCL side of it; its answer (or error) lands in ``reply``."""
    reply: dict = {}

    def target() -> None:
        try:
            reply.update(call())
        except Exception as exc:  # shown in the report and by the caller's assertion
            reply["error"] = f"{type(exc).__name__}: {exc}"[:2000]

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return reply, thread


def compare(fleet: Fleet, reps: int = 1) -> dict:
    """Greedy rollouts of both servers (sparse and dense), ``reps`` passes; tokens keyed server-schedule-pass."""
    ps = prompts(COMPARE_PROMPTS, COMPARE_LEN)
    runs = {f"{where}-{sched}-{rep}": [rollout(fleet.servers[i].base, p, sched, fleet.sizes.new_tokens, top_logprobs=2)
                                        for p in ps]
            for rep in range(reps) for sched in (SPARSE, DENSE) for i, where in enumerate(("nccl", "disk"))}
    return runs


def equal_counts(runs: dict) -> dict:
    return {sched: sum(a["token_ids"] == b["token_ids"] for a, b in zip(runs[f"nccl-{sched}-0"], runs[f"disk-{sched}-0"]))
            for sched in (SPARSE, DENSE)}


def divergence(a: dict, b: dict) -> dict | None:
    """Where two greedy rollouts part: the position, the top-2 logprob gap of each there (a near-tie,
    under a nat, is what rounding can flip; a wide gap is a different computation) and the largest
    |logprob difference| before it. ``None`` when the tokens are equal."""
    ta, tb = a["token_ids"], b["token_ids"]
    first = next((i for i in range(min(len(ta), len(tb))) if ta[i] != tb[i]), None)
    if first is None:
        return None
    gap = lambda r: (lambda top: round(top[0][0] - top[1][0], 4) if len(top) >= 2 else None)(r["top_logprobs"][first])
    before = [abs(x - y) for x, y in zip(a["logprobs"][:first], b["logprobs"][:first])]
    return {"at": first, "gap_nccl": gap(a), "gap_disk": gap(b), "max_abs_lp_before": round(max(before, default=0.0), 5),
            "abs_lp_at": round(abs(a["logprobs"][first] - b["logprobs"][first]), 5)}


def divergences(runs: dict) -> dict:
    return {sched: [divergence(a, b) for a, b in zip(runs[f"nccl-{sched}-0"], runs[f"disk-{sched}-0"])]
            for sched in (SPARSE, DENSE)}


def self_divergences(runs: dict) -> dict:
    """Each server against its own second pass (same requests, one at a time): where it parts from itself."""
    keys = sorted({k.rsplit("-", 1)[0] for k in runs if k.endswith("-1")})
    return {k: [divergence(a, b) for a, b in zip(runs[f"{k}-0"], runs[f"{k}-1"])] for k in keys}


def tolerance_problems(runs: dict) -> dict:
    """Per schedule, what breaks the bf16 tolerance (``greedy_agreement``) between the NCCL-updated server
    and the disk-updated one: a weight or landmark left from the old weights moves every position."""
    run = lambda key: run_from_rollouts(runs[key])
    return {sched: agreement_problems(run(f"disk-{sched}-0"), run(f"nccl-{sched}-0"), min_compared=0.0)
            for sched in (SPARSE, DENSE)}


def saved_runs(runs: dict) -> dict:
    """Every rollout's tokens, logprobs and top-2 gaps, for reading a divergence afterwards."""
    return {k: run_from_rollouts(v).to_json() for k, v in runs.items()}


def idle_update(fleet: Fleet, trainer: Trainer, weights_b: Path, rec: dict) -> None:
    reply, seconds, count = trainer.send(weights_b, "nccl-step-1")
    rec.update(tensors=count, update_s=round(seconds, 3), reply=reply)
    disk = post(fleet.servers[1].base, "/update_weights_from_disk", {"model_path": str(weights_b), "weight_version": "disk-step-1"})
    checksums = [post(s.base, "/weights_checker", {"action": "checksum"}) for s in fleet.servers]
    runs = compare(fleet, reps=2)
    rec.update({
        "versions": [runs[f"nccl-{SPARSE}-0"][0]["meta"]["weight_version"], runs[f"disk-{SPARSE}-0"][0]["meta"]["weight_version"]],
        "weights_checksum_equal": checksums[0].get("per_engine_checksum") == checksums[1].get("per_engine_checksum"),
        "checksums": checksums,
        "each_server_repeats_itself": {k: [r["token_ids"] for r in runs[f"{k}-0"]] == [r["token_ids"] for r in runs[f"{k}-1"]]
                                       for k in (f"{w}-{s}" for w in ("nccl", "disk") for s in (SPARSE, DENSE))},
        "rollouts_equal_to_disk_update": equal_counts(runs), "rollouts": COMPARE_PROMPTS,
        "divergences": divergences(runs), "self_divergences": self_divergences(runs),
        "tolerance_problems": tolerance_problems(runs), "runs": saved_runs(runs),
        "distinct_tokens": [len(set(r["token_ids"])) for r in runs[f"disk-{SPARSE}-0"]]})
    assert reply.get("success"), reply
    assert disk.get("success"), disk
    assert rec["weights_checksum_equal"], "the NCCL update left other weights than the disk one"
    # Bit-equal weights (the checksums) decode the same up to bf16 ties: run 1 parted at a top-2 gap of
    # 0.0 with equal logprobs before, and the disk-updated server parted from itself there too. Token
    # equality is recorded; agreement within the tolerance is the check.
    assert not any(rec["tolerance_problems"].values()), f"NCCL-updated server disagrees with the disk-updated one: {rec['tolerance_problems']}"
    assert rec["versions"][0] == "nccl-step-1", rec["versions"]


def stream(base: str, prompt: list[int], new_tokens: int, progress: list) -> dict:
    """One streamed sparse ``/rollout`` (NDJSON); ``progress[0]`` counts its tokens as they arrive."""
    body = {"input_ids": prompt, "schedule": SPARSE, "stream": True, "sampling_params": sampling(new_tokens)}
    tokens, meta, errors = [], None, []
    t0 = time.monotonic()
    try:
        with httpx.stream("POST", base + "/rollout", json=body, headers={"Accept": "application/x-ndjson"},
                          timeout=120) as r:
            if r.status_code != 200:
                r.read()
                return {"status": r.status_code, "error": r.text[:500], "tokens": 0}
            for line in r.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if "error" in event:
                    errors.append(event["error"])
                tokens += event.get("token_ids") or []
                progress[0] = len(tokens)
                if event.get("done"):
                    meta = event.get("meta")
    except httpx.HTTPError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    return {"status": 200, "tokens": len(tokens), "token_ids": tokens, "errors": errors, "seconds": round(time.monotonic() - t0, 2),
            "weight_version": (meta or {}).get("weight_version"), "finish_reason": (meta or {}).get("finish_reason")}


def stream_through_update(fleet: Fleet, trainer: Trainer, weights_c: Path, rec: dict) -> tuple[dict, list[dict]]:
    """Start the streams, pause once each has a token, update over NCCL, continue; the update's reply
    and each stream's result (all its tokens)."""
    sizes, base = fleet.sizes, fleet.servers[0].base
    ps = prompts(sizes.streams, sizes.prompt_len, seed=11)
    progress = [[0] for _ in ps]
    reply: dict = {}
    with ThreadPoolExecutor(sizes.streams) as pool:
        futures = [pool.submit(stream, base, p, sizes.stream_new_tokens, prog) for p, prog in zip(ps, progress)]
        deadline = time.monotonic() + 120
        while not all(p[0] > 0 for p in progress) and time.monotonic() < deadline and not all(f.done() for f in futures):
            time.sleep(0.02)
        t0 = time.monotonic()
        rec["pause"] = post(base, "/pause_generation", {"mode": PAUSE_MODE}, timeout=120)
        rec["tokens_at_pause"] = [p[0] for p in progress]
        try:
            # bounded: were SGLang to wait for the paused requests before updating, this would never end
            reply, seconds, _ = trainer.send(weights_c, "nccl-step-2", flush_cache=False, timeout_s=90)
            rec.update(update_reply=reply, update_s=round(seconds, 3))
        finally:
            rec["continue"] = post(base, "/continue_generation", {}, timeout=120)
            rec["paused_s"] = round(time.monotonic() - t0, 3)
        results = [f.result() for f in futures]
    rec["stream_results"] = [{k: v for k, v in r.items() if k != "token_ids"} for r in results]
    rec["stream_tokens"] = [r.get("token_ids") for r in results]
    return reply, results


def update_under_streams(fleet: Fleet, trainer: Trainer, weights_c: Path, rec: dict) -> None:
    sizes = fleet.sizes
    rec.update(streams=sizes.streams, stream_new_tokens=sizes.stream_new_tokens, pause_mode=PAUSE_MODE)
    reply, results = stream_through_update(fleet, trainer, weights_c, rec)
    rec["in_flight_at_pause"] = sum(0 < n < sizes.stream_new_tokens for n in rec["tokens_at_pause"])
    # compared before any assertion, so that the report has it whatever else failed
    disk = post(fleet.servers[1].base, "/update_weights_from_disk", {"model_path": str(weights_c), "weight_version": "disk-step-2"})
    runs = compare(fleet)
    rec.update(versions=[runs[f"nccl-{SPARSE}-0"][0]["meta"]["weight_version"], runs[f"disk-{SPARSE}-0"][0]["meta"]["weight_version"]],
               rollouts_equal_to_disk_update=equal_counts(runs), rollouts=COMPARE_PROMPTS, disk_reply=disk,
               divergences=divergences(runs), tolerance_problems=tolerance_problems(runs), runs=saved_runs(runs))
    assert reply.get("success"), reply
    assert all(r["status"] == 200 and r["tokens"] == sizes.stream_new_tokens and not r["errors"] for r in results), \
        rec["stream_results"]
    assert rec["in_flight_at_pause"] > 0, f"no stream was mid-flight at the pause: {rec['tokens_at_pause']}"
    assert disk.get("success"), disk
    assert not any(rec["tolerance_problems"].values()), \
        f"after the update under streams, server 0 disagrees with the disk-updated server 1: {rec['tolerance_problems']}"
    assert rec["versions"][0] == "nccl-step-2", rec["versions"]


def run(fleet: Fleet, rec: dict) -> None:
    if fleet.engine != "sglang":
        raise RuntimeError("the nccl part needs two GPUs and --engine sglang")
    weights_b = S.write_tiny_checkpoint(fleet.tmp / "weights-b", seed=1, lm_head_std=0.5, attn_scale=2.0)
    weights_c = S.write_tiny_checkpoint(fleet.tmp / "weights-c", seed=2, lm_head_std=0.5, attn_scale=2.0)
    trainer = Trainer(fleet.servers[0].base)
    failed = []
    # the update under streams runs even if the idle one's comparison failed: it is a check of its own
    for name, step in (("idle", lambda r: idle_update(fleet, trainer, weights_b, r)),
                       ("under_streams", lambda r: update_under_streams(fleet, trainer, weights_c, r))):
        sub = rec.setdefault(name, {})
        try:
            step(sub)
            sub["ok"] = True
        except Exception as exc:
            sub.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:4000])
            failed.append(f"{name}: {sub['error'][:300]}")
    assert not failed, "; ".join(failed)
