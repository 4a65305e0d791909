"""Settings of the SGLang plug-in, shared by both halves: the scheduler processes read them from their
environment, the HTTP process reads the same ones to report and refuse what the schedulers will do.

The schedulers are spawned, so settings travel as environment variables (``sparrow-server serve
--engine sglang`` sets them from its flags). Every default is defined here, once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from sparrow_server.kernels import (
    DEFAULT_LANDMARK_DTYPE, LANDMARK_STORAGE_DTYPES, SELECT_VARIANTS, default_select_variant,
)
from sparrow_server.sparsity.registry import ScheduleRegistry

BACKEND_NAME = "sparrow"
# The sparse decode kernel's page: SGLang runs with --page-size PAGE_SIZE (the host passes it, the
# backend checks it), and the engine reports it as the server's page size.
PAGE_SIZE = 16
PROMPT_LOGPROBS_OFF = -1  # SGLang's logprob_start_len for "output logprobs only" (engine and verifier requests)

ENV_DEFAULT_SCHEDULE = "SPARROW_DEFAULT_SCHEDULE"
ENV_SCHEDULE_DIR = "SPARROW_SCHEDULE_DIR"
ENV_TOPK_CAP_TOKENS = "SPARROW_TOPK_CAP_TOKENS"
ENV_LANDMARK_DTYPE = "SPARROW_LANDMARK_DTYPE"
ENV_SELECT_VARIANT = "SPARROW_SELECT_VARIANT"  # the selection kernels (``sparrow_server.kernels``)
# Exact acceptance on a subsample (issue 25): every s-th generated position of a verified request
# (0: off, the top-k lower bound only), and the scheduler's memory for the kept rows.
ENV_EXACT_STRIDE = "SPARROW_EXACT_STRIDE"
ENV_EXACT_MAX_MIB = "SPARROW_EXACT_MAX_MIB"
# Sub-rows of the sparse decode under CUDA graphs (issue 24): each row's pages as N rows of their own, attended
# unsplit on FlashInfer's tensor cores and merged, in every captured batch (1: off, FlashInfer's own split).
ENV_SUB_ROWS = "SPARROW_SUB_ROWS"

DEFAULT_SCHEDULE = "dense"
# Largest top-k (in tokens, reserved pages excluded) one decode step may select per row; budgets
# above it are clamped (and counted). The fused select kernel has no static width, so by default
# there is no cap beyond the context length.
DEFAULT_TOPK_CAP_TOKENS = 1 << 20
# Landmark dtypes beside the default (kernels.DEFAULT_LANDMARK_DTYPE, bfloat16): float32, the oracle's, for tests;
# float8_e4m3fn, half bfloat16's read in the scoring, each (page, KV head) landmark stored with a power-of-two scale
# (kernels.reference.store_landmarks; unscaled, a dummy-weight server's keys of ~1e-3 rounded to zero and it decoded
# 3.6-5.7% slower: benchmarks/results/speed/call42/README.md).
LANDMARK_DTYPES = LANDMARK_STORAGE_DTYPES
DEFAULT_EXACT_STRIDE = 16
DEFAULT_EXACT_MAX_MIB = 4096
# Off: served, 2 sub-rows moved decode by -4.8% to +4.8% over six workloads (benchmarks/results/speed/call38/). The
# kernel bench's CUDA-core times at 32-34 requests (159-173 us a layer), where sub-rows had gained, were those cards':
# the served replays took 139.4 (32 x 32K) and 140.4 (34, in SGLang's graph of 40) where 2 sub-rows' kernel took
# 158.8, and on one card bench and server agree (call 39).
DEFAULT_SUB_ROWS = 1
MAX_SUB_ROWS = 16


class PluginConfigError(ValueError):
    """A bad plug-in setting; ``field`` names the environment variable."""

    def __init__(self, field_name: str, value: object, reason: str):
        self.field = field_name
        self.value = value
        super().__init__(f"{field_name}={value!r}: {reason}")


def _int_env(env, name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    text = env.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        raise PluginConfigError(name, text, "must be an integer") from None
    if value < minimum:
        raise PluginConfigError(name, value, f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise PluginConfigError(name, value, f"must be <= {maximum}")
    return value


@dataclass(frozen=True)
class PluginConfig:
    default_schedule: str = DEFAULT_SCHEDULE
    schedule_dir: str | None = None
    topk_cap_tokens: int = DEFAULT_TOPK_CAP_TOKENS
    landmark_dtype: str = DEFAULT_LANDMARK_DTYPE
    select_variant: str | None = None  # None: by the model's GQA group (kernels.default_select_variant)
    exact_stride: int = DEFAULT_EXACT_STRIDE
    exact_max_mib: int = DEFAULT_EXACT_MAX_MIB
    sub_rows: int = DEFAULT_SUB_ROWS

    @property
    def topk_cap_pages(self) -> int:
        """The top-k cap in pages: the one value both processes pass to ``kv_budget_tokens`` (the
        schedulers plan with it, the HTTP process reports each token's budget with it)."""
        return max(1, self.topk_cap_tokens // PAGE_SIZE)

    def select_variant_for(self, group: int) -> str:
        """The selection kernels of a model whose GQA group is ``group``: SPARROW_SELECT_VARIANT's, else by the group."""
        return self.select_variant or default_select_variant(group)

    def server_dense_layers(self) -> tuple[int, ...]:
        """Layers the backend runs dense for every request (the stock path): the default schedule's, fixed
        when the schedulers start (the backend allocates landmarks for the others, where a request's
        schedule may keep more layers dense). The HTTP process reads the same set from the same settings."""
        return ScheduleRegistry.load(persist_dir=self.schedule_dir).get(self.default_schedule).dense_layers

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "PluginConfig":
        env = os.environ if environ is None else environ
        cap_text = env.get(ENV_TOPK_CAP_TOKENS, str(DEFAULT_TOPK_CAP_TOKENS))
        try:
            cap = int(cap_text)
        except ValueError:
            raise PluginConfigError(ENV_TOPK_CAP_TOKENS, cap_text, "must be an integer") from None
        if cap < 1:
            raise PluginConfigError(ENV_TOPK_CAP_TOKENS, cap, "must be >= 1")
        dtype = env.get(ENV_LANDMARK_DTYPE, DEFAULT_LANDMARK_DTYPE)
        if dtype not in LANDMARK_DTYPES:
            raise PluginConfigError(ENV_LANDMARK_DTYPE, dtype, f"must be one of {list(LANDMARK_DTYPES)}")
        variant = env.get(ENV_SELECT_VARIANT) or None
        if variant is not None and variant not in SELECT_VARIANTS:
            raise PluginConfigError(ENV_SELECT_VARIANT, variant, f"must be one of {list(SELECT_VARIANTS)}")
        return cls(
            sub_rows=_int_env(env, ENV_SUB_ROWS, DEFAULT_SUB_ROWS, 1, MAX_SUB_ROWS),
            exact_stride=_int_env(env, ENV_EXACT_STRIDE, DEFAULT_EXACT_STRIDE, 0),
            exact_max_mib=_int_env(env, ENV_EXACT_MAX_MIB, DEFAULT_EXACT_MAX_MIB, 0),
            default_schedule=env.get(ENV_DEFAULT_SCHEDULE, DEFAULT_SCHEDULE),
            schedule_dir=env.get(ENV_SCHEDULE_DIR) or None,
            topk_cap_tokens=cap,
            landmark_dtype=dtype,
            select_variant=variant,
        )
