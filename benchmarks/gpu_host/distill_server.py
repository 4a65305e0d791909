"""The rollout server of the DistillSparse GPU run: ``sparrow-server serve`` on the converted model, SmolLM2's
study settings (``smollm2.py``) with CUDA graphs up to ``--cuda-graph-max-bs`` and ``--concurrency`` requests running
(past the largest captured batch SGLang decodes eagerly, several times slower)."""
from __future__ import annotations

import time
from typing import Any

from run_common import engine_args, logger, serve_command


def server_args(config: Any) -> list[str]:
    if config.engine == "reference":  # the CPU dry run of the server path
        return engine_args(config)
    # serve owns --max-running-requests (sglang_plugin.frontend.host.OWNED_SGLANG_FLAGS): pass it as its own flag
    return ["--max-batch-size", str(config.concurrency), *engine_args(config)]


def start_server(config: Any, clock: Any) -> tuple[Any, str]:
    """Start the server in its own process group and wait for ``/health``; returns (process, url)."""
    from grpo_gpu import ROOT, Proc, wait_healthy

    url = f"http://127.0.0.1:{config.port}"
    cmd = [*serve_command(config, config.port, config.out / "server-state"), *server_args(config)]
    assert ROOT.is_dir()
    server = Proc(cmd, config.out / "server.log", env={})
    t0 = time.monotonic()
    try:
        wait_healthy(server, url, config.server_timeout_s)
    except BaseException:
        server.stop()
        raise
    logger("distill_gpu")(clock, f"server healthy after {time.monotonic() - t0:.0f} s")
    return server, url
