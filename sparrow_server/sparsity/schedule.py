"""Sparsity schedules: the KV budget of a request as a function of its length.

A schedule is data (a frozen dataclass), loaded from JSON or YAML and validated at load
time. ``budget_tokens(schedule, length)`` is the one budget function every engine calls, and
``kv_budget_tokens`` the one definition of what a step attends (the reported metric).

Semantics (Sparrow, Zhou et al. 2026):
- the length axis is cut into bins of ``bin_tokens`` tokens; bin ``i`` covers lengths
  ``[i * bin_tokens, (i + 1) * bin_tokens)`` and the last bin extends to infinity;
- ``length`` is the number of KV tokens the decode step attends (prompt + generated so far,
  the token being decoded included) when ``length_basis == "total"`` (the paper's choice),
  or only the generated part when ``length_basis == "generated"``;
- each bin's budget is in tokens, a multiple of ``page_size``, and *includes* the reserved
  pages (``sink_pages`` first pages and ``recent_pages`` last pages, the current partial
  page being the last one);
- a sequence with no more pages than the budget attends densely;
- ``dense_layers`` always attend densely; the ``dense`` schedule (no budgets) is stock attention.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEDULE_FORMAT_VERSION = 1
DEFAULT_PAGE_SIZE = 16
DEFAULT_BIN_TOKENS = 2000
DEFAULT_SINK_PAGES = 1
DEFAULT_RECENT_PAGES = 2
DEFAULT_DENSE_LAYERS: tuple[int, ...] = (0, 1)
LENGTH_BASES = ("total", "generated")
MAX_SCHEDULE_INT = 1 << 40  # every integer field: far above any context, far below int64 (engines hold them)
# A name's UTF-8 bytes: "<name>.json" and its temporary ".<name>.XXXXXXXX.tmp" fit a 255-byte file name.
MAX_NAME_BYTES = 200
DENSE_SCHEDULE_NAME = "dense"


class ScheduleError(ValueError):
    """A schedule that fails validation. ``field`` names the offending field, ``value`` its value."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        self.reason = reason
        super().__init__(f"schedule field {field_name!r} = {value!r}: {reason}")


@dataclass(frozen=True)
class Schedule:
    """A versioned KV-budget schedule.

    ``budgets_tokens`` is empty for a dense schedule (no sparsity at any length).
    ``threshold`` is the p5-acceptance target the schedule was calibrated for (monitoring
    compares live p5 against it); ``None`` when unknown.
    """

    name: str
    budgets_tokens: tuple[int, ...] = ()
    version: int = 1
    page_size: int = DEFAULT_PAGE_SIZE
    bin_tokens: int = DEFAULT_BIN_TOKENS
    length_basis: str = "total"
    sink_pages: int = DEFAULT_SINK_PAGES
    recent_pages: int = DEFAULT_RECENT_PAGES
    dense_layers: tuple[int, ...] = DEFAULT_DENSE_LAYERS
    threshold: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def is_dense(self) -> bool:
        return not self.budgets_tokens

    @property
    def reserved_pages(self) -> int:
        return self.sink_pages + self.recent_pages

    @property
    def id(self) -> str:
        """Versioned identifier, e.g. ``qwen3-1.7b-0.86@1``."""
        return f"{self.name}@{self.version}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["budgets_tokens"] = list(self.budgets_tokens)
        d["dense_layers"] = list(self.dense_layers)
        d["format_version"] = SCHEDULE_FORMAT_VERSION
        return d


def _validate(s: Schedule) -> None:
    if not isinstance(s.name, str) or not s.name or len(s.name) > 128 or not _is_slug(s.name):
        raise ScheduleError("name", s.name, "must be 1-128 characters of letters, digits, '.', '_' or '-'")
    if len(s.name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ScheduleError("name", s.name, f"is {len(s.name.encode('utf-8'))} bytes in UTF-8; at most {MAX_NAME_BYTES} "
                                            "(a registered schedule is saved as <name>.json, and file names are short)")
    _check_int("version", s.version, minimum=1)
    _check_int("page_size", s.page_size, minimum=1)
    _check_int("bin_tokens", s.bin_tokens, minimum=1)
    _check_int("sink_pages", s.sink_pages, minimum=0)
    _check_int("recent_pages", s.recent_pages, minimum=1)  # the partial page must stay last
    if s.length_basis not in LENGTH_BASES:
        raise ScheduleError("length_basis", s.length_basis, f"must be one of {list(LENGTH_BASES)}")
    for layer in s.dense_layers:
        _check_int("dense_layers", layer, minimum=0)
    if len(set(s.dense_layers)) != len(s.dense_layers):
        raise ScheduleError("dense_layers", list(s.dense_layers), "has duplicates")
    if s.threshold is not None and (isinstance(s.threshold, bool) or not isinstance(s.threshold, (int, float))
                                    or not 0.0 < s.threshold <= 1.0):
        raise ScheduleError("threshold", s.threshold, "must be in (0, 1]")
    if not isinstance(s.description, str):
        raise ScheduleError("description", s.description, "must be a string")
    reserved_tokens = s.reserved_pages * s.page_size
    for i, b in enumerate(s.budgets_tokens):
        _check_int(f"budgets_tokens[{i}]", b, minimum=1)
        if b % s.page_size:
            raise ScheduleError(f"budgets_tokens[{i}]", b, f"is not a multiple of page_size {s.page_size}")
        if b <= reserved_tokens:
            raise ScheduleError(
                f"budgets_tokens[{i}]", b,
                f"must exceed the reserved pages ({s.reserved_pages} pages = {reserved_tokens} tokens)",
            )
        if i and b < s.budgets_tokens[i - 1]:
            raise ScheduleError(
                f"budgets_tokens[{i}]", b,
                f"decreases with length (previous bin has {s.budgets_tokens[i - 1]})",
            )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(name, value, "must be an integer")
    if value < minimum:
        raise ScheduleError(name, value, f"must be >= {minimum}")
    if value > MAX_SCHEDULE_INT:
        raise ScheduleError(name, value, f"must be <= {MAX_SCHEDULE_INT} (2**40)")


def _is_slug(text: str) -> bool:
    return all((c.isalnum() and c.isprintable()) or c in "._-" for c in text)


def budget_tokens(schedule: Schedule, length: int, prompt_len: int = 0) -> int:
    """KV budget in tokens for a decode step that attends ``length`` tokens.

    ``length``: prompt + generated tokens in the KV cache (current token included).
    ``prompt_len``: used only when ``schedule.length_basis == "generated"``.
    For the dense schedule the budget covers every page (so attention is dense).
    """
    if schedule.is_dense:
        return math.ceil(length / schedule.page_size) * schedule.page_size
    basis = length if schedule.length_basis == "total" else max(length - prompt_len, 0)
    return schedule.budgets_tokens[bin_index(schedule, basis)]


def bin_index(schedule: Schedule, basis_length: int) -> int:
    """Bin of a basis length, clamped to the last (open-ended) bin."""
    last = max(len(schedule.budgets_tokens) - 1, 0)
    return min(basis_length // schedule.bin_tokens, last)


def budget_pages(schedule: Schedule, length: int, prompt_len: int = 0) -> int:
    """``budget_tokens`` in pages."""
    return budget_tokens(schedule, length, prompt_len) // schedule.page_size


def attended_pages(schedule: Schedule, length: int, prompt_len: int = 0, max_topk_pages: int | None = None) -> int:
    """Pages a sparse layer attends at ``length`` tokens: every page while the sequence fits the
    budget (attention is dense), else the budget (reserved pages + top-k). ``max_topk_pages``: an
    engine's cap on the top-k part (the SGLang backend's), None for none. Never more than the
    sequence's pages, so any budget, however large, is executable."""
    n_pages = max(math.ceil(length / schedule.page_size), 1)
    if schedule.is_dense:
        return n_pages
    budget = budget_pages(schedule, length, prompt_len)
    if n_pages <= budget:
        return n_pages
    if max_topk_pages is not None:
        budget = min(budget, schedule.reserved_pages + max_topk_pages)
    return budget


def kv_budget_tokens(schedule: Schedule, length: int, prompt_len: int = 0, max_topk_pages: int | None = None) -> int:
    """``kv_budget_tokens`` as ``docs/metrics.md`` defines it: the KV tokens a sparse layer attends
    in a decode step at ``length`` tokens (current token included). The attended pages end with the
    current page, which counts its real tokens (``length`` when attention is dense). The one
    definition every engine reports."""
    page_size = schedule.page_size
    last_page_tokens = (max(length, 1) - 1) % page_size + 1
    return (attended_pages(schedule, length, prompt_len, max_topk_pages) - 1) * page_size + last_page_tokens


def is_sparse_at(schedule: Schedule, length: int, prompt_len: int = 0) -> bool:
    """True when a step at ``length`` attends fewer pages than the sequence has."""
    n_pages = math.ceil(length / schedule.page_size)
    return not schedule.is_dense and budget_pages(schedule, length, prompt_len) < n_pages


def dense_schedule() -> Schedule:
    """The built-in ``dense`` schedule: no budgets, stock attention at every length."""
    return Schedule(name=DENSE_SCHEDULE_NAME, description="Stock dense attention at every length.")


def from_pages_excluding_reserved(name: str, pages: Iterable[int], **fields: Any) -> Schedule:
    """Build a schedule from the paper's encoding: top-k pages per bin, excluding reserved pages."""
    sink = fields.get("sink_pages", DEFAULT_SINK_PAGES)
    recent = fields.get("recent_pages", DEFAULT_RECENT_PAGES)
    ps = fields.get("page_size", DEFAULT_PAGE_SIZE)
    budgets = tuple((int(v) + sink + recent) * ps for v in pages)
    return Schedule(name=name, budgets_tokens=budgets, **fields)


_FIELDS = {f for f in Schedule.__dataclass_fields__}


def schedule_from_dict(data: Mapping[str, Any]) -> Schedule:
    """Parse and validate a schedule mapping (JSON/YAML object). Raises ``ScheduleError``."""
    if not isinstance(data, Mapping):
        raise ScheduleError("<root>", type(data).__name__, "a schedule must be a JSON/YAML object")
    data = dict(data)
    fmt = data.pop("format_version", SCHEDULE_FORMAT_VERSION)
    if fmt != SCHEDULE_FORMAT_VERSION:
        raise ScheduleError("format_version", fmt, f"unsupported (this build reads {SCHEDULE_FORMAT_VERSION})")
    if "budgets_pages_excluding_reserved" in data:
        if "budgets_tokens" in data:
            raise ScheduleError("budgets_pages_excluding_reserved", "...", "give either it or budgets_tokens")
        pages = data.pop("budgets_pages_excluding_reserved")
        if not isinstance(pages, list):
            raise ScheduleError("budgets_pages_excluding_reserved", pages, "must be a list of integers")
        for i, v in enumerate(pages):
            _check_int(f"budgets_pages_excluding_reserved[{i}]", v, minimum=0)
        sink = data.get("sink_pages", DEFAULT_SINK_PAGES)
        recent = data.get("recent_pages", DEFAULT_RECENT_PAGES)
        ps = data.get("page_size", DEFAULT_PAGE_SIZE)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in (sink, recent, ps)):
            data["budgets_tokens"] = [(v + sink + recent) * ps for v in pages]
        # else: Schedule() names the non-integer field
    for key in data:
        if not isinstance(key, str):
            raise ScheduleError(repr(key), key, "field names must be strings")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ScheduleError(unknown[0], data[unknown[0]], f"unknown field (known: {sorted(_FIELDS)})")
    if "name" not in data:
        raise ScheduleError("name", None, "is required")
    for key in ("budgets_tokens", "dense_layers"):
        if key in data:
            if not isinstance(data[key], (list, tuple)):
                raise ScheduleError(key, data[key], "must be a list of integers")
            data[key] = tuple(data[key])
    return Schedule(**data)


def load_schedule(path: str | Path) -> Schedule:
    """Load a schedule from a ``.json``, ``.yaml`` or ``.yml`` file."""
    path = Path(path)
    text = path.read_text()
    return parse_schedule_text(text, yaml_format=path.suffix.lower() in (".yaml", ".yml"))


def parse_schedule_text(text: str, yaml_format: bool = False) -> Schedule:
    """Parse and validate schedule JSON (or YAML) text. Raises ``ScheduleError``."""
    try:
        if yaml_format:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # parse errors of either format
        raise ScheduleError("<root>", text[:40], f"not valid {'YAML' if yaml_format else 'JSON'}: {exc}") from exc
    return schedule_from_dict(data)


def dump_schedule(schedule: Schedule) -> str:
    """JSON text that ``parse_schedule_text`` reads back to an equal schedule."""
    return json.dumps(schedule.to_dict(), indent=2) + "\n"


__all__ = [
    "Schedule", "ScheduleError", "budget_tokens", "budget_pages", "bin_index", "is_sparse_at", "attended_pages",
    "kv_budget_tokens",
    "dense_schedule", "from_pages_excluding_reserved", "schedule_from_dict", "load_schedule",
    "parse_schedule_text", "dump_schedule", "DENSE_SCHEDULE_NAME",
]
