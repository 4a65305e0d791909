"""Call 2 of the GPU plan: compile the FlashInfer/Triton kernels for SmolLM2's shapes (head dim 64,
3 KV heads, G = 3) while the model's last part is still on its way. Starts SGLang with the sparrow
backend and dummy weights of the same config, decodes a sparse and a dense batch at ~3K context
(prefill, sparse and dense decode, CUDA graphs), and stops. The caches stay on the warm host.

    python benchmarks/gpu_host/warmup.py --work /tmp/w16 --out $OUT/warmup.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import sglang_server as S  # noqa: E402
import smollm2  # noqa: E402

SPARSE_PRESET = "qwen3-1.7b-0.86"  # 512 tokens below 2,000: sparse at a 3K context


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=31400)
    args = ap.parse_args()
    model = smollm2.write_dummy_model(args.work / "smollm2-dummy")
    srv = S.Server(model, smollm2.SERVER_ARGS + ["--load-format", "dummy", "--attention-backend", "sparrow",
                                                 "--page-size", "16"],
                   args.work / "server-warmup.log", port=args.port)
    res = {"start_s": round(srv.start(timeout_s=560), 1)}
    try:
        rng = random.Random(0)
        prompts = [[rng.randrange(10, 49000) for _ in range(3000)] for _ in range(4)]
        for name in (SPARSE_PRESET, "dense"):
            t0 = time.time()
            outs = S.generate(srv.base, prompts, 64, schedule=name, temperature=1.0, return_logprob=True)
            res[name] = {"wall_s": round(time.time() - t0, 2), "tokens": sum(len(o["output_ids"]) for o in outs)}
    finally:
        srv.stop()
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
