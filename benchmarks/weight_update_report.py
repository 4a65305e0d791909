"""The report of ``benchmarks/weight_update_timing.py``: host facts, per-path summaries, the checks that
each path really replaced the weights, and the printed table."""
from __future__ import annotations

import os
import statistics
import subprocess
import tempfile


def host_facts(trainer_gpu: int, server_gpu: int) -> dict:
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
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "trainer_gpu": trainer_gpu, "server_gpu": server_gpu}


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
