"""Build a ``ReferenceEngine`` from ``EngineOptions`` (the ``reference`` entry of the engine factory)."""
from __future__ import annotations

from sparrow_server.engine.factory import BuiltEngine, EngineOptions
from sparrow_server.engine.weight_groups import DEFAULT_GROUP_TIMEOUT_S
from sparrow_server.engine.reference.engine import DEFAULT_KV_POOL_TOKENS, DEFAULT_MAX_BATCH_SIZE, ReferenceEngine


def build_reference_engine(options: EngineOptions) -> BuiltEngine:
    import torch

    from sparrow_server.models import load_model

    if options.threads:
        torch.set_num_threads(options.threads)
    loaded = load_model(options.model, device=options.device)
    engine = ReferenceEngine(
        loaded.model, loaded.tokenizer, loaded.name,
        kv_pool_tokens=options.kv_pool_tokens or DEFAULT_KV_POOL_TOKENS,
        max_batch_size=options.max_batch_size or DEFAULT_MAX_BATCH_SIZE,
        weight_version=options.weight_version,
        weight_group_timeout_s=options.weight_group_timeout_s or DEFAULT_GROUP_TIMEOUT_S,
    )
    for name, path in options.adapters:
        engine.load_adapter(name, path)
    return BuiltEngine(engine, loaded.tokenizer, loaded.name)
