"""Reference engine: PyTorch + transformers, paged KV cache, the core library's sparse decode."""
from sparrow_server.engine.reference.engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
