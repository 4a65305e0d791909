"""A conversation as prompt token ids through the tokenizer's chat template, defined once.

``apply_chat_template(..., tokenize=True)`` returns a plain list of ids in transformers 4.x but a
``BatchEncoding`` in 5.x (``return_dict`` defaults to True there; it is a ``UserDict``, not a
``dict``, so reading it as a sequence gives its keys). Every caller (``/rollout`` with
``apply_chat_template``, ``/v1/chat/completions``, calibration prompts, the examples) goes through
``chat_template_ids``, which accepts either shape and returns a ``list[int]``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

from sparrow_server.engine.base import InvalidRequestError

# apply_chat_template arguments this module sets; a client's chat_template_kwargs may not change them
# (they would change what the call returns, or clash with the ones passed here).
RESERVED_TEMPLATE_KWARGS = frozenset({"conversation", "add_generation_prompt", "tokenize", "return_dict",
                                      "return_tensors", "return_assistant_tokens_mask"})


def user_turn(text: str) -> list[dict[str, str]]:
    """A one-message conversation: the user says ``text``."""
    return [{"role": "user", "content": text}]


def chat_template_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                      template_kwargs: Mapping[str, Any] | None = None,
                      kwargs_field: str = "chat_template_kwargs") -> list[int]:
    """The prompt ids of ``messages`` with the generation prompt appended. ``template_kwargs`` go
    to the template (e.g. ``enable_thinking``); a reserved key raises ``InvalidRequestError``
    naming ``kwargs_field.KEY``."""
    extra = dict(template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & extra.keys())
    if reserved:
        key = reserved[0]
        raise InvalidRequestError(f"{kwargs_field}.{key}", extra[key], "is set by the server and cannot be overridden")
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **extra)
    return token_id_list(out)


def token_id_list(out: Any) -> list[int]:
    """One prompt's ids from what a tokenizer returned: a list of ints, a mapping with
    ``input_ids`` (``BatchEncoding``), an array/tensor, or any of these batched with one row."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    ids = list(out)
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int)), None)
    if bad is not None:
        raise TypeError(f"the tokenizer returned {type(out).__name__} holding {bad!r}, not token ids")
    return [int(t) for t in ids]


__all__ = ["chat_template_ids", "token_id_list", "user_turn", "RESERVED_TEMPLATE_KWARGS"]
