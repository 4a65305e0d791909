"""Bodies of the OpenAI-compatible routes (``/v1/completions``, ``/v1/chat/completions``), as SGLang
0.5.17 accepts them (``srt/entrypoints/openai/protocol.py``): OpenAI's fields plus SGLang's sampling
extras. Each converts into the same ``SamplingParamsIn`` as ``/generate``, so defaults, bounds and
refusals are those of ``/generate``.

The schedule: ``sparrow_schedule`` (the ``openai`` client's ``extra_body``), else
``custom_params.sparrow_schedule``, else ``extra_key`` = ``sparrow_schedule=NAME``, else the server's
default. The adapter: ``model`` = ``BASE:ADAPTER`` (SGLang's syntax) or ``lora_path``.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from sparrow_server.engine.base import InvalidRequestError
from sparrow_server.server.api_models import STRICT, SamplingParamsIn
from sparrow_server.server.generate_models import extra_key_schedule
from sparrow_server.sparsity import wire

OPENAI_COMPLETION_MAX_TOKENS = 16  # OpenAI's (and SGLang's) default for /v1/completions
# Accepted only empty: OpenAI/SGLang features this server does not implement (422 naming the field).
UNSUPPORTED_COMPLETION = ("echo", "suffix", "response_format", "custom_logit_processor", "return_hidden_states",
                          "session_params")
UNSUPPORTED_CHAT = ("tools", "tool_choice", "functions", "function_call", "response_format", "audio", "modalities",
                    "custom_logit_processor", "return_hidden_states", "continue_final_message", "reasoning_effort")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", **STRICT)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _OpenAIBase(BaseModel):
    """Fields shared by both routes. Unknown keys are ignored, as SGLang's OpenAI server does."""

    model_config = ConfigDict(extra="ignore", **STRICT)

    model: str
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    no_stop_trim: Optional[bool] = None
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    user: Optional[str] = None  # OpenAI's end-user id for abuse monitoring: accepted, not used
    rid: Optional[str] = None
    lora_path: Optional[str] = None
    custom_params: Optional[dict[str, Any]] = None
    extra_key: Optional[str] = None
    sparrow_schedule: Optional[str] = None

    def unsupported(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name, None)
            if value:
                raise InvalidRequestError(name, value, "is not supported by this server")

    def sampling(self, max_new_tokens: int | None) -> SamplingParamsIn:
        """The ``/generate`` sampling params of this body (null fields take /generate's defaults)."""
        data = {"max_new_tokens": max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "min_p": self.min_p, "seed": self.seed, "stop": self.stop,
                "stop_token_ids": self.stop_token_ids, "stop_regex": self.stop_regex,
                "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
                "repetition_penalty": self.repetition_penalty, "min_new_tokens": self.min_tokens,
                "logit_bias": self.logit_bias, "ignore_eos": self.ignore_eos,
                "skip_special_tokens": self.skip_special_tokens, "no_stop_trim": self.no_stop_trim,
                "json_schema": self.json_schema, "regex": self.regex, "ebnf": self.ebnf, "n": self.n,
                "custom_params": self.custom_params}
        try:
            return SamplingParamsIn.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first.get("loc") else "body"
            raise InvalidRequestError(name, first.get("input"), first.get("msg", "invalid")) from None

    def schedule_name(self) -> str | None:
        if self.sparrow_schedule is not None:
            return self.sparrow_schedule
        value = (self.custom_params or {}).get(wire.SCHEDULE_PARAM)
        return value if isinstance(value, str) else extra_key_schedule(self.extra_key)

    def adapter(self) -> str | None:
        """``BASE:ADAPTER`` names an adapter (SGLang's syntax); ``lora_path`` too."""
        if ":" in self.model:
            return self.model.split(":", 1)[1] or None
        return self.lora_path


class CompletionIn(_OpenAIBase):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = OPENAI_COMPLETION_MAX_TOKENS
    logprobs: Optional[int] = None  # top-k logprobs per token (0: only the chosen token's)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    response_format: Optional[dict[str, Any]] = None
    custom_logit_processor: Optional[str] = None
    return_hidden_states: bool = False
    session_params: Optional[dict[str, Any]] = None

    def check(self) -> None:
        self.unsupported(UNSUPPORTED_COMPLETION)
        if self.best_of not in (None, 1, self.n):
            raise InvalidRequestError("best_of", self.best_of, "is not supported by this server (only n samples)")

    def prompts(self) -> list[tuple[list[int] | None, str | None]]:
        """(input_ids, text) of each prompt: a string, a token list, or a list of either."""
        prompt = self.prompt
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise InvalidRequestError("prompt", [], "must not be empty")
        return [(None, p) if isinstance(p, str) else (list(p), None) for p in prompt]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", **STRICT)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None

    def text(self, index: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text":
                raise InvalidRequestError(f"messages[{index}].content[{j}].type", part.get("type"),
                                          "only text parts are supported by this server")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatCompletionIn(_OpenAIBase):
    messages: list[ChatMessage]
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    response_format: Optional[dict[str, Any]] = None
    audio: Optional[Any] = None
    modalities: Optional[list[str]] = None
    custom_logit_processor: Optional[str] = None
    return_hidden_states: bool = False
    continue_final_message: bool = False
    reasoning_effort: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def check(self) -> None:
        if self.response_format is not None and self.response_format.get("type") == "text":
            self.response_format = None  # OpenAI's default format: plain text
        if self.tool_choice == "none":
            self.tool_choice = None
        self.unsupported(UNSUPPORTED_CHAT)
        if not self.messages:
            raise InvalidRequestError("messages", [], "must not be empty")

    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` (else the deprecated ``max_tokens``); None: until the context is full."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]
