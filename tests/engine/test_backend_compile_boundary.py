"""The sparrow backend's layer calls are torch.compile graph breaks: under SGLang's ``--enable-torch-compile`` dynamo
compiles the model's forward around ``forward_decode``/``forward_extend`` and must not trace them (their host-planned
step state and Triton launches on side buffers are not graph inputs it could track). The backend module is imported
over stand-ins of the SGLang and FlashInfer names it needs (no SGLang on CPU); the GPU measurement of the flag is
``benchmarks/results/speed/call44/``."""
from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace

import pytest
import torch

SCHEDULER_PACKAGE = "sparrow_server.sglang_plugin.scheduler"
BACKEND_MODULE = SCHEDULER_PACKAGE + ".backend"


class StockFlashInferBackend:
    """What the sparrow backend falls back to (its dense layers): plain tensor arithmetic dynamo can trace."""

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        return q * 3

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        return q * 5


def _stand_in(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


@pytest.fixture
def backend_module():
    """The backend module imported over the stand-ins; afterwards ``sys.modules`` and the scheduler package's
    attributes are as they were, so no later test sees a module imported over them."""
    stand_ins = {
        "sglang": _stand_in("sglang"),
        "sglang.srt": _stand_in("sglang.srt"),
        "sglang.srt.layers": _stand_in("sglang.srt.layers"),
        "sglang.srt.layers.attention": _stand_in("sglang.srt.layers.attention"),
        "sglang.srt.layers.attention.flashinfer_backend": _stand_in(
            "sglang.srt.layers.attention.flashinfer_backend", FlashInferAttnBackend=StockFlashInferBackend,
            KVWriteLoc=tuple),
        "sglang.srt.mem_cache": _stand_in("sglang.srt.mem_cache"),
        "sglang.srt.mem_cache.memory_pool": _stand_in("sglang.srt.mem_cache.memory_pool", MHATokenToKVPool=object),
        "flashinfer": _stand_in("flashinfer", BatchDecodeWithPagedKVCacheWrapper=object, fast_decode_plan=None),
    }
    package = importlib.import_module(SCHEDULER_PACKAGE)
    attributes = dict(vars(package))

    def over_stand_ins(name):  # the modules that see the stand-ins: those and the scheduler side's own
        return name in stand_ins or name.startswith(SCHEDULER_PACKAGE + ".")

    saved = {name: module for name, module in sys.modules.items() if over_stand_ins(name)}
    for name in saved:
        del sys.modules[name]  # imported again over the stand-ins
    sys.modules.update(stand_ins)
    try:
        yield importlib.import_module(BACKEND_MODULE)
    finally:
        for name in [m for m in sys.modules if over_stand_ins(m)]:
            del sys.modules[name]
        sys.modules.update(saved)
        for name in set(vars(package)) - set(attributes):
            delattr(package, name)
        for name, value in attributes.items():
            setattr(package, name, value)
        torch._dynamo.reset()


def _dense_layer_backend(module):
    """A backend whose layer 0 is dense (no landmarks): its calls reach the stock path."""
    backend = module.SparrowAttnBackend.__new__(module.SparrowAttnBackend)
    backend.landmarks, backend.step = {}, None
    return backend, SimpleNamespace(layer_id=0, is_cross_attention=False)


@pytest.mark.parametrize("method, factor", [("forward_decode", 3), ("forward_extend", 5)])
def test_layer_calls_are_graph_breaks(backend_module, method, factor):
    backend, layer = _dense_layer_backend(backend_module)

    def model(x):
        return getattr(backend, method)(x + 1, None, None, layer, None) - 1

    x = torch.arange(4.0)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count >= 1, explanation  # the layer call ran eagerly, outside the graph
    assert torch.equal(torch.compile(model, backend="eager")(x), (x + 1) * factor - 1)  # and gave its result


def test_the_stand_in_alone_would_be_traced(backend_module):
    """Without the boundary dynamo traces such a call into the graph: what the test above tells apart."""
    stock, layer = StockFlashInferBackend(), SimpleNamespace(layer_id=0, is_cross_attention=False)
    explanation = torch._dynamo.explain(lambda x: stock.forward_decode(x + 1, None, None, layer, None) - 1)(
        torch.arange(4.0))
    assert explanation.graph_break_count == 0, explanation
