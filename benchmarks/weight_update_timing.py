"""Seconds and GB/s of SGLang 0.5.17's three weight-update paths into one sparrow server (issue 23, item 1).

``sparrow-server serve --engine sglang`` serves Qwen3-1.7B, started with dummy weights, on GPU 1; the trainer
(this process) is on GPU 0.

The same tensors go through every path: Qwen3-1.7B's Hugging Face names and shapes (310 tensors, 1.72 B
parameters, 3.44 GB in bf16; the tied ``lm_head.weight`` is not sent, as ``save_pretrained`` does not write it),
random bf16 values drawn on the GPU with a fixed seed.

- ``nccl`` (slime's path): ``/init_weights_update_group``, then per update slime's sequence
  ``pause_generation`` -> ``GET /flush_cache`` -> one ``/update_weights_from_distributed`` per bucket of at
  most 512 MiB (slime's ``--update-weight-buffer-size`` default) with every tensor of the bucket broadcast
  from rank 0 -> ``continue_generation``. ``seconds``: that whole sequence; ``transfer_s``: the bucket requests.
- ``disk``: the trainer writes config.json + safetensors (HF layout, 5 GB shards) under a temporary directory
  (``save_s``, device-to-host copy included), then ``/update_weights_from_disk`` (``seconds``). The files were
  just written, so they are read from the page cache, not from the disk.
- ``tensor`` (verl's path): verl colocates trainer and rollout, so a subprocess on the server's card (GPU 1)
  draws the same tensors there and sends ``/update_weights_from_tensor`` per bucket of at most 2048 MiB (verl's
  ``update_weights_bucket_megabytes`` default; tensors cloned into each bucket as verl does), each with
  ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)`` (CUDA IPC handles) and
  ``flush_cache: true`` (SGLang's default, which verl's request keeps), then ``GET /flush_cache``. verl first
  wraps each tensor in SGLang's ``LocalSerializedTensor`` (one more pickle per tensor); the transport is the same.

Checks after each path: SGLang's per-engine weight checksum (``/weights_checker``) equals the other paths' and
differs from the one before (dummy weights; between paths the trainer sends the negated tensors over NCCL so
that each path has to change the weights to pass), ``/get_weight_version`` names the last update, and an
8-token greedy dense ``/rollout`` runs under that version.

Writes ``OUT/weight_update_timing.json`` and ``OUT/server.log``; prints a table. Exit status 1 if a check or a
path failed (a failed disk or tensor path does not stop the next one), 3 past ``--deadline-s`` (a hung broadcast).
Usage (GPU host, kit installed): python benchmarks/weight_update_timing.py OUT [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import httpx  # noqa: E402

import sglang_server as S  # noqa: E402
from fleet_gpu.common import AUTH, KEY, NCCL_ENV, post  # noqa: E402
from weight_tensors import buckets, digest, make_tensors, nbytes, param_shapes, save_checkpoint  # noqa: E402

SIZE = "qwen3-1.7b"
SEED = 23
# THUDM/slime@624b824 slime/utils/arguments.py: --update-weight-buffer-size default 512 * 1024**2.
SLIME_BUCKET_BYTES = 512 * 1024**2
# volcengine/verl@b178a3c verl/workers/config/rollout.py: update_weights_bucket_megabytes = 2048 (<< 20 in
# verl/workers/rollout/sglang_rollout/sglang_rollout.py).
VERL_BUCKET_BYTES = 2048 << 20
TRAINER_GPU, SERVER_GPU = 0, 1
PORT = 31500
PROMPT = [(37 * i + 101) % 150000 + 100 for i in range(64)]
STOP: list = []  # what the deadline must stop before leaving (the server)
ARGS = ["--api-key", KEY, "--load-format", "dummy", "--context-length", "40960", "--mem-fraction-static", "0.6",
        "--disable-radix-cache", "--max-batch-size", "8", "--cuda-graph-max-bs", "8",
        "--cuda-graph-backend-prefill", "disabled"]


def get(base: str, path: str) -> httpx.Response:
    return httpx.get(base + path, headers=AUTH, timeout=120)


def flush(base: str) -> None:
    """slime's SGLangEngine.flush_cache: retry until 200 (not 200 while requests are pending)."""
    for _ in range(60):
        if get(base, "/flush_cache").status_code == 200:
            return
        time.sleep(1)
    raise TimeoutError("flush_cache never answered 200")


def server_state(base: str) -> dict:
    """Checksum, weight version and one short greedy dense rollout of the server's current weights."""
    ck = post(base, "/weights_checker", {"action": "checksum"})
    body = {"input_ids": PROMPT, "schedule": "dense",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}}
    r = httpx.post(base + "/rollout", json=body, headers=AUTH, timeout=300)
    r.raise_for_status()
    roll = r.json()
    return {"checksum": ck.get("per_engine_checksum"), "weight_version": get(base, "/get_weight_version").json().get(
        "weight_version"), "rollout_tokens": roll["token_ids"], "rollout_version": roll["meta"]["weight_version"]}


# ---- NCCL (slime) ----

def open_group(base: str, port: int = 29623):
    """Trainer rank 0 on GPU 0, the server rank 1 (fleet_2gpu.py's working form)."""
    import torch
    from sglang.srt.utils.common import init_custom_process_group

    name = f"sparrow-timing-{int(time.time())}"  # a server never reuses a group name
    reply: dict = {}
    th = threading.Thread(target=lambda: reply.update(post(base, "/init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "group_name": name,
        "backend": "nccl"})))
    th.start()
    torch.cuda.set_device(TRAINER_GPU)
    pg = init_custom_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0,
                                   group_name=name)
    th.join()
    if not reply.get("success"):
        raise RuntimeError(f"init_weights_update_group: {reply}")
    return pg, name


def nccl_bucket(base: str, pg, group: str, tensors: dict, names: list[str], version: str) -> None:
    """One bucket as slime's update_weights_from_distributed sends it: the request, and meanwhile one async
    broadcast per tensor from rank 0."""
    import torch

    body = {"names": names, "dtypes": [str(tensors[n].dtype).replace("torch.", "") for n in names],
            "shapes": [list(tensors[n].shape) for n in names], "group_name": group, "flush_cache": False,
            "weight_version": version}
    reply: dict = {}
    th = threading.Thread(target=lambda: reply.update(post(base, "/update_weights_from_distributed", body)))
    th.start()
    for h in [torch.distributed.broadcast(tensors[n], src=0, group=pg, async_op=True) for n in names]:
        h.wait()
    th.join()
    if not reply.get("success"):
        raise RuntimeError(f"update_weights_from_distributed: {reply}")


def nccl_update(base: str, pg, group: str, tensors: dict, plan: list[list[str]], version: str) -> dict:
    """slime's UpdateWeightFromDistributed.update_weights: pause, flush, buckets, continue."""
    t0 = time.perf_counter()
    post(base, "/pause_generation", {})
    flush(base)
    per_bucket = []
    for names in plan:
        tb = time.perf_counter()
        nccl_bucket(base, pg, group, tensors, names, version)
        per_bucket.append(time.perf_counter() - tb)
    post(base, "/continue_generation", {})
    return {"seconds": time.perf_counter() - t0, "transfer_s": sum(per_bucket), "bucket_s": per_bucket}


def reset(base: str, pg, group: str, tensors: dict, plan, version: str) -> dict:
    """Put other weights in (the negated tensors, restored exactly afterwards: bf16 negation is a sign flip),
    so the next path has to change the weights for its checksum to match."""
    for t in tensors.values():
        t.neg_()
    try:
        timing = nccl_update(base, pg, group, tensors, plan, version)
    finally:
        for t in tensors.values():
            t.neg_()
    return {"seconds": round(timing["seconds"], 3), **server_state(base)}


# ---- disk ----

def disk_updates(base: str, model_dir: Path, reps: int) -> dict:
    seconds, versions = [], []
    for rep in range(reps):
        versions.append(f"disk-{rep}")
        t0 = time.perf_counter()
        # the server started with --load-format dummy, which SGLang reuses for a disk update unless told
        body = {"model_path": str(model_dir), "weight_version": versions[-1], "load_format": "auto"}
        reply = post(base, "/update_weights_from_disk", body)
        seconds.append(time.perf_counter() - t0)
        if not reply.get("success"):
            raise RuntimeError(f"update_weights_from_disk: {reply}")
    return {"seconds": seconds, "versions": versions}


# ---- tensors (verl), run in a subprocess on the server's GPU ----

def tensor_worker(spec_path: Path) -> None:
    """The colocated trainer: draw the tensors on this card, send them bucket by bucket, write the timings."""
    import torch
    from sglang.srt.utils import MultiprocessingSerializer

    try:  # verl calls it before serializing: CUDA IPC handles then name the device by UUID
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:
        from sglang.srt.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()
    spec = json.loads(spec_path.read_text())
    tensors = make_tensors(param_shapes(S.qwen3_config(SIZE)), spec["seed"], "cuda")
    plan = buckets([(n, t.numel() * t.element_size()) for n, t in tensors.items()], VERL_BUCKET_BYTES)
    out = {"digest": digest(tensors), "bytes": nbytes(tensors), "requests": len(plan), "seconds": [],
           "serialize_s": [], "versions": []}
    for rep in range(spec["reps"]):
        out["versions"].append(f"tensor-{rep}")
        t0, ser = time.perf_counter(), 0.0
        for names in plan:
            named = [(n, tensors[n].clone()) for n in names]  # verl's get_named_tensor_buckets clones
            torch.cuda.synchronize()  # the server reads the clones from another process
            ts = time.perf_counter()
            payload = {"serialized_named_tensors": [MultiprocessingSerializer.serialize(named, output_str=True)],
                       "flush_cache": True, "weight_version": out["versions"][-1]}
            ser += time.perf_counter() - ts
            reply = post(spec["base"], "/update_weights_from_tensor", payload)
            if not reply.get("success"):
                raise RuntimeError(f"update_weights_from_tensor: {reply}")
            del named, payload
        flush(spec["base"])  # verl's update_weights ends with flush_cache
        out["seconds"].append(time.perf_counter() - t0)
        out["serialize_s"].append(round(ser, 4))
    Path(spec["out"]).write_text(json.dumps(out))


def tensor_updates(base: str, reps: int, work: Path) -> dict:
    spec = work / "tensor_worker.json"
    result = work / "tensor_worker_result.json"
    spec.write_text(json.dumps({"base": base, "seed": SEED, "reps": reps, "out": str(result)}))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(SERVER_GPU))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--tensor-worker", str(spec)], env=env,
                          capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        raise RuntimeError(f"tensor worker exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(result.read_text())


# ---- report ----

def host_facts() -> dict:
    import torch

    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            return f"{cmd[0]}: {e}"

    try:
        import sglang
        sglang_version = sglang.__version__
    except ImportError:
        sglang_version = None
    return {"gpus": sh("nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"),
            "topology": sh("nvidia-smi", "topo", "-m"), "tmp_filesystem": sh("df", "-hT", tempfile.gettempdir()),
            "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()), "sglang": sglang_version,
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "trainer_gpu": TRAINER_GPU, "server_gpu": SERVER_GPU}


def summarize(path: str, seconds: list[float], nbytes_: int, requests: int, bucket_bytes: int | None, **extra) -> dict:
    med = statistics.median(seconds)
    return {"path": path, "bytes": nbytes_, "requests_per_update": requests, "bucket_bytes": bucket_bytes,
            "seconds": [round(s, 3) for s in seconds], "gbps": [round(nbytes_ / s / 1e9, 2) for s in seconds],
            "median_s": round(med, 3), "median_gbps": round(nbytes_ / med / 1e9, 2), **extra}


def checks(report: dict) -> dict:
    paths, before = report["paths"], report["before"]["checksum"]
    sent = paths["nccl"]["after"]["checksum"] if "nccl" in paths else None
    out = {"all_three_paths_ran": set(paths) == {"nccl", "disk", "tensor"},
           "nccl_changed_the_dummy_weights": sent is not None and sent != before}
    for name, r in report.get("resets", {}).items():
        out[f"{name}_changed_the_weights"] = r["checksum"] != sent
    for name, p in paths.items():
        after = p["after"]
        if name != "nccl":
            out[f"{name}_checksum_equals_nccl"] = after["checksum"] == sent
        out[f"{name}_version_is_last_update"] = after["weight_version"] == after["rollout_version"] == p["versions"][-1]
        out[f"{name}_rollout_ran"] = len(after["rollout_tokens"]) == 8
    if "tensor" in paths:  # without it the tensor path's checksum could not match
        out["tensor_worker_drew_the_same_tensors"] = paths["tensor"]["worker_digest"] == report["trainer_digest"]
    return out


def print_table(report: dict) -> None:
    print(f"\n{'path':<8} {'requests':>8} {'GB':>6} {'seconds per update':<26} {'median s':>9} {'GB/s':>6}")
    for name, p in report["paths"].items():
        print(f"{name:<8} {p['requests_per_update']:>8} {p['bytes'] / 1e9:>6.2f} "
              f"{' '.join(f'{s:.3f}' for s in p['seconds']):<26} {p['median_s']:>9.3f} {p['median_gbps']:>6.2f}")
    if "disk" in report["paths"]:
        print(f"disk: save (device-to-host + safetensors) {report['paths']['disk']['save']['save_s']} s; "
              "loads read the page cache")
    if "nccl" in report["paths"]:
        print(f"nccl: bucket requests alone {report['paths']['nccl']['transfer_s']} s "
              "(the rest: pause, flush, continue)")
    for k, v in report.get("checks", {}).items():
        print(f"{'ok  ' if v else 'FAIL'} {k}")
    for k, v in report.get("errors", {}).items():
        print(f"ERROR {k}: {v}")
    print(f"same greedy tokens after each path: {report.get('same_rollout_tokens_after_each_path')}")


def nccl_path(c: dict, report: dict) -> None:
    runs = [nccl_update(c["base"], c["pg"], c["group"], c["tensors"], c["plan"], f"nccl-{rep}")
            for rep in range(c["reps"])]
    report["paths"]["nccl"] = summarize(
        "update_weights_from_distributed", [r["seconds"] for r in runs], c["bytes"], len(c["plan"]),
        SLIME_BUCKET_BYTES, transfer_s=[round(r["transfer_s"], 3) for r in runs],
        transfer_gbps=[round(c["bytes"] / r["transfer_s"] / 1e9, 2) for r in runs],
        bucket_s=[round(s, 3) for s in runs[-1]["bucket_s"]], versions=[f"nccl-{rep}" for rep in range(c["reps"])],
        after=server_state(c["base"]))


def disk_path(c: dict, report: dict) -> None:
    report["resets"]["reset_before_disk"] = reset(c["base"], c["pg"], c["group"], c["tensors"], c["plan"], "reset-1")
    saved = save_checkpoint(c["tensors"], c["cfg"], c["work"] / "weights")
    disk = disk_updates(c["base"], c["work"] / "weights", c["reps"])
    report["paths"]["disk"] = summarize("update_weights_from_disk", disk["seconds"], c["bytes"], 1, None, save=saved,
                                        versions=disk["versions"], after=server_state(c["base"]))


def tensor_path(c: dict, report: dict) -> None:
    report["resets"]["reset_before_tensor"] = reset(c["base"], c["pg"], c["group"], c["tensors"], c["plan"], "reset-2")
    worker = tensor_updates(c["base"], c["reps"], c["work"])
    report["paths"]["tensor"] = summarize(
        "update_weights_from_tensor", worker["seconds"], worker["bytes"], worker["requests"], VERL_BUCKET_BYTES,
        serialize_s=worker["serialize_s"], versions=worker["versions"], worker_digest=worker["digest"],
        after=server_state(c["base"]))


def trainer(base: str, cfg: dict, reps: int, work: Path, report: dict) -> dict:
    """The trainer's tensors on GPU 0 and its NCCL group with the server."""
    import torch

    torch.cuda.set_device(TRAINER_GPU)
    tensors = make_tensors(param_shapes(cfg), SEED, f"cuda:{TRAINER_GPU}")
    torch.cuda.synchronize()
    report["trainer_digest"], report["tensors"] = digest(tensors), len(tensors)
    pg, group = open_group(base)
    plan = buckets([(n, t.numel() * t.element_size()) for n, t in tensors.items()], SLIME_BUCKET_BYTES)
    return {"base": base, "cfg": cfg, "reps": reps, "work": work, "tensors": tensors, "bytes": nbytes(tensors),
            "pg": pg, "group": group, "plan": plan}


def server_placement(all_visible: bool) -> tuple[dict, list[str]]:
    """(environment, SGLang flags) putting the server on ``SERVER_GPU``: by hiding the other card
    (``CUDA_VISIBLE_DEVICES``), or with every card visible and ``--base-gpu-id`` (as slime places its
    engines). NCCL's cuMem P2P transport grants the peer card access to each buffer, which a process
    that cannot see the peer card cannot do: the placement may decide whether P2P works."""
    if all_visible:
        return {}, ["--base-gpu-id", str(SERVER_GPU)]
    return {"CUDA_VISIBLE_DEVICES": str(SERVER_GPU)}, []


def run(out: Path, reps: int, report: dict, work: Path, all_visible: bool = False) -> None:
    cfg = S.qwen3_config(SIZE)
    env, placement = server_placement(all_visible)
    server = S.Server(S.write_config(work / "dummy", cfg), ARGS + placement + ["--state-dir", str(work / "state")],
                      out / "server.log", port=PORT, env=env, sparrow=True)
    report["server_placement"] = {"env": env, "args": placement}
    report["host"] = host_facts()
    report["server_args"] = [a if a != KEY else "<key>" for a in ARGS]
    STOP.append(server.stop)
    try:
        report["startup_s"] = round(server.start(timeout_s=300), 1)
        report["before"] = server_state(server.base)
        c = trainer(server.base, cfg, reps, work, report)
        nccl_path(c, report)
        for name, path in (("disk", disk_path), ("tensor", tensor_path)):
            try:  # a GPU run is scarce: one path's failure is recorded and the next still runs
                path(c, report)
            except Exception as e:  # noqa: BLE001
                report["errors"][name] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
    finally:
        server.stop()


def nccl_env(p2p: bool) -> dict:
    """fleet_2gpu's NCCL settings; with ``p2p``, NCCL's defaults for peer-to-peer and cuMem (NVLink
    between the two processes' cards) instead of host shared memory, NVLink multicast still off."""
    drop = ("NCCL_P2P_DISABLE", "NCCL_CUMEM_ENABLE") if p2p else ()
    return {k: v for k, v in NCCL_ENV.items() if k not in drop}


def main(out: Path, reps: int, deadline_s: float, p2p: bool = False, legacy_ipc: bool = False,
         all_visible: bool = False) -> int:
    for k in ("NCCL_P2P_DISABLE", "NCCL_CUMEM_ENABLE"):
        os.environ.pop(k, None)
    os.environ.update(nccl_env(p2p))  # the server inherits it (Server copies os.environ)
    if legacy_ipc:
        os.environ["NCCL_CUMEM_ENABLE"] = "0"  # P2P through cudaIpc handles instead of cuMem
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="weight-timing-"))
    report: dict = {"command": " ".join(sys.argv), "model": SIZE, "seed": SEED, "reps": reps, "paths": {},
                    "resets": {}, "errors": {}, "notes": ["disk loads read files just written: page cache warm",
                                            "nccl rep 0 includes NCCL's lazy communicator set-up"]}

    def write() -> None:
        (out / "weight_update_timing.json").write_text(json.dumps(report, indent=1, default=str))

    def expire() -> None:  # a broadcast whose peer never joins blocks forever: leave with what we have
        report["error"] = f"deadline of {deadline_s} s reached"
        for stop in STOP:
            stop()
        write()
        print(report["error"], flush=True)
        os._exit(3)

    watchdog = threading.Timer(deadline_s, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        run(out, reps, report, work, all_visible)
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        if "before" in report:
            report["checks"] = checks(report)
            # Not a check: the same weights should give the same greedy tokens (issue 23 saw one rollout differ
            # between an NCCL- and a disk-updated server), but timings are this script's purpose.
            report["same_rollout_tokens_after_each_path"] = len(
                {json.dumps(p["after"]["rollout_tokens"]) for p in report["paths"].values()}) == 1
        write()
        if report["paths"]:
            print_table(report)
        else:
            print(json.dumps(report, indent=1, default=str))
    return 0 if report.get("checks") and all(report["checks"].values()) and not report["errors"] else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?", help="output directory")
    ap.add_argument("--reps", type=int, default=3, help="updates per path")
    ap.add_argument("--deadline-s", type=float, default=420, help="give up (exit 3, partial JSON) after this long")
    ap.add_argument("--nccl-p2p", action="store_true",
                    help="NCCL's default P2P/cuMem transport between trainer and server (default: host shared memory)")
    ap.add_argument("--nccl-legacy-ipc", action="store_true", help="with --nccl-p2p: NCCL_CUMEM_ENABLE=0")
    ap.add_argument("--server-sees-all-gpus", action="store_true",
                    help="place the server with --base-gpu-id instead of CUDA_VISIBLE_DEVICES")
    ap.add_argument("--tensor-worker", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tensor_worker:
        tensor_worker(a.tensor_worker)
        sys.exit(0)
    if a.out is None:
        ap.error("OUT is required")
    try:
        rc = main(a.out, a.reps, a.deadline_s, a.nccl_p2p, a.nccl_legacy_ipc, a.server_sees_all_gpus)
    except Exception:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    # The trainer's NCCL communicator outlives its peer (the stopped server); interpreter teardown can then
    # block in NCCL's destructor, so leave without it once everything is written.
    os._exit(rc)
