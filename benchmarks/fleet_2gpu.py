"""Two GPUs of one host: two ``sparrow-server serve --engine sglang`` servers behind sglang-router
(issue 6), and SGLang's NCCL weight path from a stand-in trainer (issue 8).

1. Server ``i`` runs on GPU ``i`` (a tiny random Qwen3 with peaked outputs, weights A). The router
   (round robin) gets 32 ``/generate`` requests from ``SparrowClient.generate`` (schedule in
   ``custom_params`` and ``extra_key``, the form that survives the router): all complete, both
   workers serve some, each answer equals the same request sent straight to a worker's ``/rollout``.
2. The trainer (this process, on GPU 1) opens an NCCL group with server 0 (``/init_weights_update_group``)
   and broadcasts weights B (``/update_weights_from_distributed``); server 1 loads B from disk. Both
   then answer the same greedy rollouts token for token, under weight version labels of their own.

Writes ``OUT/fleet_2gpu_<parts>.json`` and the server/router logs.
Usage: python benchmarks/fleet_2gpu.py OUT [--parts router,nccl]
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import httpx  # noqa: E402

import sglang_server as S  # noqa: E402
from fleet_router import RouterSettings, running_router  # noqa: E402
from sparrow_server.client import SparrowClient  # noqa: E402

KEY = "fleet-2gpu-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SPARSE = "qwen3-1.7b-0.86"
NEW = 48
# SGLang 0.5.17's /health is its /health_generate: it queues a one-token generation, then sleeps 1 s
# before its first look for output (entrypoints/http_server.py, health_generate), so it never answers
# in under a second. The CPU fleet tests' 1 s health-check timeout therefore timed out every check of a
# GPU worker (gpu_call8: "HTTP health check failed ... TimedOut" while Python clients, with longer
# timeouts, got 200). The router's default timeout (5 s) is what deploy/ runs.
SGLANG_ROUTER = RouterSettings(health_check_interval_s=2, health_check_timeout_s=5, startup_timeout_s=120.0)
ARGS = ["--api-key", KEY, "--max-batch-size", "16", "--mem-fraction-static", "0.3", "--cuda-graph-max-bs", "16",
        "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache"]


def prompts(n: int, length: int = 1500) -> list[list[int]]:
    import random

    rng = random.Random(7)
    return [[rng.randrange(10, 4000) for _ in range(length)] for _ in range(n)]


def rollout(base: str, prompt: list[int], schedule: str = SPARSE) -> dict:
    body = {"input_ids": prompt, "schedule": schedule,
            "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}}
    r = httpx.post(base + "/rollout", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def post(base: str, path: str, body: dict) -> dict:
    r = httpx.post(base + path, json=body, headers=AUTH, timeout=600)
    if r.status_code != 200:
        raise RuntimeError(f"{path} -> {r.status_code}: {r.text}")
    return r.json()


def generate_requests(base_dir: Path) -> list[int]:
    return [sum(1 for line in (base_dir / f"server-{i}.log").read_text(errors="replace").splitlines()
                if '"POST /generate HTTP' in line) for i in range(2)]


def router_run(servers, out: Path, report: dict) -> None:
    ps = prompts(8)
    direct = [rollout(servers[0].base, p)["token_ids"] for p in ps]
    before = generate_requests(out)
    with running_router([s.base for s in servers], out, SGLANG_ROUTER) as router:
        client = SparrowClient(router.url, timeout=600)
        payloads = [{"input_ids": ps[i % 8], "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0,
                                                                 "ignore_eos": True}} for i in range(32)]
        t0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda p: client.generate(p, schedule=SPARSE), payloads))
        wall = time.time() - t0
    after = generate_requests(out)
    per_worker = [a - b for a, b in zip(after, before)]
    same = [o["output_ids"] == direct[i % 8] for i, o in enumerate(outs)]
    report["router"] = {"requests": len(outs), "completed": sum(len(o["output_ids"]) == NEW for o in outs),
                        "per_worker_generate_requests": per_worker, "equal_to_direct_rollout": sum(same),
                        "wall_s": round(wall, 2), "schedule": SPARSE}
    assert len(outs) == 32 and all(len(o["output_ids"]) == NEW for o in outs), "a request did not complete"
    assert all(n > 0 for n in per_worker), f"a worker got no request: {per_worker}"
    assert all(same), f"{32 - sum(same)} router answers differ from the worker's own /rollout"


def nccl_update(servers, weights_b: Path, report: dict, port: int = 29611) -> None:
    import torch
    from safetensors.torch import load_file
    from sglang.srt.utils.common import init_custom_process_group

    name = f"sparrow-trainer-{int(time.time())}"  # a group name is never reused by a server
    group = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
             "group_name": name, "backend": "nccl"}
    reply: dict = {}
    server_side = threading.Thread(target=lambda: reply.update(post(servers[0].base, "/init_weights_update_group", group)))
    server_side.start()
    torch.cuda.set_device(1)
    pg = init_custom_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0,
                                   group_name=name)
    server_side.join()
    assert reply.get("success"), reply
    tensors = {k: v.to("cuda:1") for k, v in load_file(str(weights_b / "model.safetensors")).items()}
    names = sorted(tensors)
    body = {"names": names, "dtypes": [str(tensors[n].dtype).replace("torch.", "") for n in names],
            "shapes": [list(tensors[n].shape) for n in names], "group_name": name,
            "weight_version": "nccl-step-1"}
    reply = {}
    t0 = time.time()
    server_side = threading.Thread(target=lambda: reply.update(post(servers[0].base, "/update_weights_from_distributed", body)))
    server_side.start()
    for n in names:
        torch.distributed.broadcast(tensors[n], src=0, group=pg)
    server_side.join()
    nccl_s = time.time() - t0
    assert reply.get("success"), reply
    disk = post(servers[1].base, "/update_weights_from_disk", {"model_path": str(weights_b), "weight_version": "disk-step-1"})
    assert disk.get("success"), disk
    # Which of the candidate causes of a mismatch holds: the weights themselves (SGLang's per-engine
    # checksum of every parameter: a tensor not sent or cast differs), or the serving state
    # (each server answers the same rollouts twice: non-determinism shows as a server unequal to itself).
    checksums = [post(s.base, "/weights_checker", {"action": "checksum"}) for s in servers]
    ps = prompts(4, 1200)
    runs = {f"{where}-{sched}-{rep}": [rollout(servers[i].base, p, sched) for p in ps]
            for rep in (0, 1) for sched in (SPARSE, "dense") for i, where in enumerate(("nccl", "disk"))}
    tokens = {k: [r["token_ids"] for r in v] for k, v in runs.items()}
    equal = {sched: [a == b for a, b in zip(tokens[f"nccl-{sched}-0"], tokens[f"disk-{sched}-0"])]
             for sched in (SPARSE, "dense")}
    report["nccl_weight_update"] = {
        "tensors": len(names), "update_s": round(nccl_s, 3),
        "versions": [runs[f"nccl-{SPARSE}-0"][0]["meta"]["weight_version"],
                     runs[f"disk-{SPARSE}-0"][0]["meta"]["weight_version"]],
        "weights_checksum_equal": checksums[0].get("per_engine_checksum") == checksums[1].get("per_engine_checksum"),
        "checksums": checksums,
        "each_server_repeats_itself": {k: tokens[f"{k}-0"] == tokens[f"{k}-1"]
                                       for k in (f"{w}-{s}" for w in ("nccl", "disk") for s in (SPARSE, "dense"))},
        "rollouts_equal_to_disk_update": {k: sum(v) for k, v in equal.items()}, "rollouts": len(ps),
        "distinct_tokens": [len(set(t)) for t in tokens[f"disk-{SPARSE}-0"]]}
    assert report["nccl_weight_update"]["weights_checksum_equal"], "the NCCL update left other weights than the disk one"
    assert all(all(v) for v in equal.values()), "NCCL-updated server differs from the disk-updated one"
    assert runs[f"nccl-{SPARSE}-0"][0]["meta"]["weight_version"] == "nccl-step-1"


# NCCL between the servers' processes and the trainer's on these VMs: no cuMem / P2P IPC (the first
# try failed with "unhandled cuda error"); host shared memory works. NVLink multicast stays off (KINDS.md).
NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "WARN"}


def main(out: Path, parts: tuple[str, ...]) -> int:
    import os

    os.environ.update(NCCL_ENV)  # the servers inherit it (Server copies os.environ)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fleet2gpu-"))
    weights_a = S.write_tiny_checkpoint(tmp / "weights-a", seed=0, lm_head_std=0.5, attn_scale=2.0)
    weights_b = S.write_tiny_checkpoint(tmp / "weights-b", seed=1, lm_head_std=0.5, attn_scale=2.0)
    servers = [S.Server(weights_a, ARGS + ["--state-dir", str(tmp / f"state-{i}")], out / f"server-{i}.log",
                        port=31400 + i, env={"CUDA_VISIBLE_DEVICES": str(i)}, sparrow=True) for i in range(2)]
    report: dict = {"servers": [s.base for s in servers]}
    try:
        with ThreadPoolExecutor(2) as pool:
            report["startup_s"] = [round(t, 1) for t in pool.map(lambda s: s.start(timeout_s=400), servers)]
        if "router" in parts:
            router_run(servers, out, report)
        if "nccl" in parts:
            nccl_update(servers, weights_b, report)
        report["ok"] = True
    finally:
        for s in servers:
            s.stop()
        (out / f"fleet_2gpu_{'_'.join(parts)}.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="router,nccl", help="router and/or nccl")
    a = ap.parse_args()
    sys.exit(main(a.out, tuple(a.parts.split(","))))
