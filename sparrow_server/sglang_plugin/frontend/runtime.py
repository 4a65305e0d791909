"""``TokenizerManagerRuntime``: the SGLang calls ``SGLangEngine`` makes, on the tokenizer manager of
the SGLang HTTP server it is mounted in (what ``sglang.Engine.async_generate`` and the
``/load_lora_adapter`` routes call). SGLang is imported only when a call is made.
"""
from __future__ import annotations

import os
from typing import Any, AsyncIterator, Callable

from sparrow_server.sglang_plugin.frontend.engine import ModelFacts


class SGLangCallError(RuntimeError):
    """SGLang refused a control call (e.g. a LoRA load); the message is SGLang's."""


class TokenizerManagerRuntime:
    """``get_tokenizer_manager()`` is called per use: SGLang creates the manager after this object."""

    def __init__(self, get_tokenizer_manager: Callable[[], Any]):
        self._get = get_tokenizer_manager

    @property
    def tokenizer_manager(self) -> Any:
        tm = self._get()
        if tm is None:
            raise RuntimeError("SGLang's tokenizer manager is not up yet")
        return tm

    def stream(self, **generate_kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        return self.tokenizer_manager.generate_request(GenerateReqInput(**generate_kwargs), None)

    async def generate(self, **generate_kwargs: Any) -> dict[str, Any]:
        """One non-streaming request (the dense verification prefill)."""
        out = None
        async for out in self.stream(**generate_kwargs, stream=False):
            pass
        return out

    def abort(self, rid: str) -> None:
        self.tokenizer_manager.abort_request(rid=rid)

    async def load_lora(self, name: str, path: str) -> None:
        from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput

        out = await self.tokenizer_manager.load_lora_adapter(LoadLoRAAdapterReqInput(lora_name=name, lora_path=path))
        if not out.success:
            raise SGLangCallError(f"SGLang could not load LoRA {name!r} from {path!r}: {out.error_message}")

    async def unload_lora(self, name: str) -> None:
        from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

        out = await self.tokenizer_manager.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=name))
        if not out.success:
            raise SGLangCallError(f"SGLang could not unload LoRA {name!r}: {out.error_message}")

    def model_facts(self) -> ModelFacts:
        tm = self.tokenizer_manager
        cfg = tm.model_config
        eos = getattr(cfg.hf_config, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        name = os.path.basename(os.path.normpath(tm.server_args.served_model_name or tm.server_args.model_path))
        return ModelFacts(name=name, context_length=int(cfg.context_len), vocab_size=int(cfg.vocab_size),
                          eos_token_ids=tuple(int(e) for e in eos_ids))


__all__ = ["TokenizerManagerRuntime", "SGLangCallError"]
