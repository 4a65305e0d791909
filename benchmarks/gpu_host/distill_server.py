"""The rollout server of the DistillSparse GPU run: ``sparrow-server serve`` on the converted model, SmolLM2's
study settings (``smollm2.py``) with CUDA graphs up to ``--cuda-graph-max-bs`` and ``--concurrency`` requests running
(past the largest captured batch SGLang decodes eagerly, several times slower)."""
from __future__ import annotations

import sys
import time
from typing import Any


def server_args(config: Any) -> list[str]:
    if config.engine == "reference":  # the CPU dry run of the server path
        return ["--device", config.device, "--threads", "1", "--kv-pool-tokens", str(config.total_tokens * config.concurrency)]
    import smollm2

    args = list(smollm2.SERVER_ARGS)
    args[args.index("--cuda-graph-max-bs") + 1] = str(config.cuda_graph_max_bs)
    # serve owns --max-running-requests (sglang_plugin.frontend.host.OWNED_SGLANG_FLAGS): pass it as its own flag
    return ["--max-batch-size", str(config.concurrency), "--", *args]


def start_server(config: Any, clock: Any) -> tuple[Any, str]:
    """Start the server in its own process group and wait for ``/health``; returns (process, url)."""
    from grpo_gpu import ROOT, Proc, wait_healthy

    url = f"http://127.0.0.1:{config.port}"
    cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", config.engine, "--model", str(config.model_dir),
           "--host", "127.0.0.1", "--port", str(config.port), "--state-dir", str(config.out / "server-state"),
           *server_args(config)]
    assert ROOT.is_dir()
    server = Proc(cmd, config.out / "server.log", env={})
    t0 = time.monotonic()
    try:
        wait_healthy(server, url, config.server_timeout_s)
    except BaseException:
        server.stop()
        raise
    print(f"[distill_gpu +{clock.elapsed():.0f}s] server healthy after {time.monotonic() - t0:.0f} s", flush=True)
    return server, url
