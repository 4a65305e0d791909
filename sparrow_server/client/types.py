"""Typed results of the client (plain dataclasses built from the server's JSON)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class SparrowError(Exception):
    """An HTTP error answer. ``status`` is the HTTP status, ``body`` the decoded JSON (if any)."""

    def __init__(self, status: int, message: str, body: Any = None):
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class RolloutMeta:
    rid: str
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    schedule: str
    adapter: str | None
    kv_budget_tokens_mean: float | None
    weight_version: str
    e2e_latency: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RolloutMeta":
        return cls(rid=d.get("rid", ""), finish_reason=d.get("finish_reason"), prompt_tokens=d.get("prompt_tokens", 0),
                   completion_tokens=d.get("completion_tokens", 0), schedule=d.get("schedule", ""),
                   adapter=d.get("adapter"), kv_budget_tokens_mean=d.get("kv_budget_tokens_mean"),
                   weight_version=d.get("weight_version", ""), e2e_latency=d.get("e2e_latency"), raw=d)


@dataclass(frozen=True)
class RolloutEvent:
    """One streamed event: new tokens of sample ``index``; ``meta`` on its last event (``done``)."""

    index: int
    rid: str
    token_ids: list[int]
    logprobs: list[float]
    kv_budget_tokens: list[int | None]
    done: bool
    text: str | None = None
    top_logprobs: list[list[list[float]]] | None = None
    selected_pages: list[Any] | None = None
    meta: RolloutMeta | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RolloutEvent":
        return cls(index=d.get("index", 0), rid=d.get("rid", ""), token_ids=d.get("token_ids", []),
                   logprobs=d.get("logprobs", []), kv_budget_tokens=d.get("kv_budget_tokens", []),
                   done=bool(d.get("done")), text=d.get("text"), top_logprobs=d.get("top_logprobs"),
                   selected_pages=d.get("selected_pages"),
                   meta=RolloutMeta.from_json(d["meta"]) if d.get("meta") else None)


@dataclass(frozen=True)
class RolloutResult:
    """A finished sample: tokens, their sparse (behaviour) logprobs and ``meta``."""

    index: int
    rid: str
    token_ids: list[int]
    logprobs: list[float]
    kv_budget_tokens: list[int | None]
    meta: RolloutMeta
    text: str | None = None
    top_logprobs: list[list[list[float]]] | None = None
    selected_pages: list[Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RolloutResult":
        return cls(index=d.get("index", 0), rid=d.get("rid", ""), token_ids=d["token_ids"], logprobs=d["logprobs"],
                   kv_budget_tokens=d.get("kv_budget_tokens", []), meta=RolloutMeta.from_json(d["meta"]),
                   text=d.get("text"), top_logprobs=d.get("top_logprobs"), selected_pages=d.get("selected_pages"))

    @classmethod
    def from_events(cls, events: list[RolloutEvent]) -> "RolloutResult":
        """Assemble one sample's streamed events (all with the same ``index``)."""
        last = events[-1]
        assert last.done and last.meta is not None, "the stream ended before its done event"
        texts = [e.text for e in events if e.text is not None]
        tops = [t for e in events for t in (e.top_logprobs or [])]
        pages = [p for e in events for p in (e.selected_pages or [])]
        return cls(index=last.index, rid=last.rid, token_ids=[t for e in events for t in e.token_ids],
                   logprobs=[x for e in events for x in e.logprobs],
                   kv_budget_tokens=[b for e in events for b in e.kv_budget_tokens], meta=last.meta,
                   text="".join(texts) if texts else None, top_logprobs=tops or None, selected_pages=pages or None)


def results_from_json(body: Any) -> list[RolloutResult]:
    """A non-streaming ``/rollout`` answer (one sample, or ``{"samples": [...]}`` for n > 1)."""
    samples = body["samples"] if isinstance(body, dict) and "samples" in body else [body]
    return [RolloutResult.from_json(s) for s in samples]


def results_from_events(events: list[RolloutEvent]) -> list[RolloutResult]:
    by_index: dict[int, list[RolloutEvent]] = {}
    for e in events:
        by_index.setdefault(e.index, []).append(e)
    return [RolloutResult.from_events(by_index[i]) for i in sorted(by_index)]
