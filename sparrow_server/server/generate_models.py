"""``POST /generate`` body: SGLang's ``GenerateReqInput``, single or batched.

A batch is ``input_ids`` as a list of lists or ``text`` as a list; every per-prompt field
(``sampling_params``, ``rid``, ``lora_path``, ``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``, ``extra_key``) is then one value for all prompts or a list with one per
prompt, as in SGLang. ``items()`` resolves the body into one ``GenerateItem`` per prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from sparrow_server.engine.base import InvalidRequestError
from sparrow_server.server.api_models import STRICT, SamplingParamsIn
from sparrow_server.sparsity import wire
from sparrow_server.sparsity.schedule import ScheduleError

NO_PROMPT_LOGPROBS = -1  # SGLang's logprob_start_len default: output logprobs only
PER_PROMPT_FIELDS = ("sampling_params", "rid", "lora_path", "return_logprob", "logprob_start_len",
                     "top_logprobs_num", "extra_key")


@dataclass(frozen=True)
class GenerateItem:
    """One prompt of a ``/generate`` body with its own values of the per-prompt fields."""

    index: int
    input_ids: list[int] | None
    text: str | None
    sampling_params: SamplingParamsIn
    rid: str | None
    lora_path: str | None
    return_logprob: bool
    logprob_start_len: int | None  # None: no prompt logprobs
    top_logprobs_num: int
    schedule_name: str | None


ONE, PER_PROMPT = "one", "per-prompt"  # union tags; errors.py drops them from error paths
UNION_TAGS = frozenset({ONE, PER_PROMPT})


def _tag_of(value: Any) -> str:
    return PER_PROMPT if isinstance(value, list) else ONE


def _tag_of_ids(value: Any) -> str:
    return PER_PROMPT if isinstance(value, list) and value and isinstance(value[0], list) else ONE


def one_or_per_prompt(single: Any, many: Any, tag=_tag_of) -> Any:
    """A field that is one value or a list of one per prompt. The discriminator picks the member by
    shape, so a bad value is reported once, for the member it was meant as."""
    return Annotated[Union[Annotated[single, Tag(ONE)], Annotated[many, Tag(PER_PROMPT)]], Discriminator(tag)]


# SGLang GenerateReqInput keys this engine does not implement: refused (422 naming the key) unless
# null, false or empty, so a client never gets an answer that silently lacks what it asked for.
UNSUPPORTED_GENERATE_KEYS = ("token_ids_logprob", "image_data", "video_data", "audio_data", "custom_logit_processor",
                             "return_hidden_states", "return_routed_experts", "session_params", "input_embeds")


class GenerateIn(BaseModel):
    """Unknown top-level keys are ignored, as SGLang does; SGLang's own keys that this engine does
    not implement are refused (``UNSUPPORTED_GENERATE_KEYS``)."""

    model_config = ConfigDict(extra="ignore", **STRICT)

    text: one_or_per_prompt(str, list[str]) | None = None
    input_ids: one_or_per_prompt(list[int], list[list[int]], _tag_of_ids) | None = None
    sampling_params: one_or_per_prompt(SamplingParamsIn, list[SamplingParamsIn]) = Field(default_factory=SamplingParamsIn)
    return_logprob: one_or_per_prompt(bool, list[bool]) = False
    logprob_start_len: one_or_per_prompt(int, list[int]) | None = None
    top_logprobs_num: one_or_per_prompt(int, list[int]) = 0
    lora_path: one_or_per_prompt(str, list[str | None]) | None = None
    stream: bool = False
    rid: one_or_per_prompt(str, list[str]) | None = None
    return_text_in_logprobs: bool = False
    # SGLang's cache salt; ``sparrow_schedule=NAME`` names the schedule
    extra_key: one_or_per_prompt(str, list[str | None]) | None = None
    # SGLang keys refused unless empty (check_supported)
    token_ids_logprob: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    custom_logit_processor: Any = None
    return_hidden_states: Any = None
    return_routed_experts: Any = None
    session_params: Any = None
    input_embeds: Any = None

    @property
    def batch_size(self) -> int | None:
        """Prompts in a batched body; None for a single prompt."""
        if isinstance(self.text, list):
            return len(self.text)
        if self.input_ids and isinstance(self.input_ids[0], list):
            return len(self.input_ids)
        return None

    def listed_fields(self) -> set[str]:
        """Top-level fields given as one value per prompt."""
        batched = {"text", "input_ids"} if self.batch_size is not None else set()
        return batched | {name for name in PER_PROMPT_FIELDS if isinstance(getattr(self, name), list)}

    def check_supported(self) -> None:
        for key in UNSUPPORTED_GENERATE_KEYS:
            value = getattr(self, key)
            if value:
                raise InvalidRequestError(key, value, "is not supported by this server (only null or empty)")

    def items(self) -> list[GenerateItem]:
        self.check_supported()
        if self.text is not None and self.input_ids is not None:  # checked before a batch is split per prompt
            raise InvalidRequestError("input_ids", self.input_ids, "give exactly one of input_ids and text")
        size = self.batch_size
        if size == 0:
            raise InvalidRequestError("text" if isinstance(self.text, list) else "input_ids", [], "must not be empty")
        for name in PER_PROMPT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, list) and (size is None or len(value) != size):
                why = "is a list but the body has one prompt" if size is None else f"has {len(value)} entries for {size} prompts"
                raise InvalidRequestError(name, value, why)
        return [self._item(i, size) for i in range(size or 1)]

    def _item(self, i: int, size: int | None) -> GenerateItem:
        def pick(name: str) -> Any:
            value = getattr(self, name)
            batched_input = size is not None and name in ("text", "input_ids") and value is not None
            return value[i] if batched_input or (name in PER_PROMPT_FIELDS and isinstance(value, list)) else value

        sampling, rid, start = pick("sampling_params"), pick("rid"), pick("logprob_start_len")
        if size is not None and isinstance(self.rid, str):
            rid = f"{self.rid}_{i}"  # one base rid for a batch: each prompt gets its own (as SGLang names them)
        return GenerateItem(
            index=i, input_ids=pick("input_ids"), text=pick("text"), sampling_params=sampling, rid=rid,
            lora_path=pick("lora_path"), return_logprob=pick("return_logprob"),
            logprob_start_len=None if not pick("return_logprob") or start in (None, NO_PROMPT_LOGPROBS) else start,
            top_logprobs_num=pick("top_logprobs_num"), schedule_name=schedule_name(sampling, pick("extra_key")),
        )


def schedule_name(sampling: SamplingParamsIn, extra_key: str | None) -> str | None:
    """``custom_params.sparrow_schedule``, else ``extra_key`` = ``sparrow_schedule=NAME``, else None (default)."""
    value = (sampling.custom_params or {}).get(wire.SCHEDULE_PARAM)
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"sampling_params.custom_params.{wire.SCHEDULE_PARAM}", value, "must be a schedule name")
    return value if value is not None else extra_key_schedule(extra_key)


def extra_key_schedule(extra_key: str | None) -> str | None:
    """The schedule named by ``extra_key`` (other extra keys are only cache salts: None)."""
    try:
        return wire.schedule_name_from_extra_key(extra_key)
    except ScheduleError as exc:  # a bad request field here, not a bad schedule
        raise InvalidRequestError(exc.field, exc.value, exc.reason) from None
