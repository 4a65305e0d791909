"""SmolLM2-135M-Instruct on the GPU host: the SGLang settings every server of the study uses (one
place, so the warm-up compiles exactly the kernels the later servers need) and the sequence length.

``TOTAL_TOKENS``: prompt + generated tokens of a study rollout, just under the model's 8,192-token
context (SGLang refuses a request whose prompt + max_new_tokens reaches the context length)."""
from __future__ import annotations

import json
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "smollm2_config.json"  # the converted model's config.json
TOTAL_TOKENS = 8160
MODEL_DIR_FILE = Path("/tmp/w16/model_dir")  # host.sh stage 3 writes the converted model's path here
SERVER_ARGS = ["--dtype", "bfloat16", "--mem-fraction-static", "0.3", "--cuda-graph-max-bs", "32",
               "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache", "--skip-tokenizer-init"]


def write_dummy_model(directory: Path) -> Path:
    """A weight-less copy of the model's config (``--load-format dummy``): same shapes, same kernels."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(json.loads(CONFIG.read_text()), indent=1))
    return directory


def default_model_dir() -> Path | None:
    """The converted model stage 3 left on this host, if any (``MODEL_DIR_FILE``)."""
    return Path(MODEL_DIR_FILE.read_text().strip()) if MODEL_DIR_FILE.is_file() else None


if __name__ == "__main__":
    print(" ".join(SERVER_ARGS))
