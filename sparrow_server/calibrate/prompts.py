"""Calibration prompts from a JSONL file: one object per line with ``input_ids`` (token ids),
``prompt`` (a user message, chat-templated when the tokenizer has a template) or ``text`` (raw)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparrow_server.engine.chat_template import chat_template_ids, user_turn


class PromptError(ValueError):
    """A bad prompts file; the message names the file, the line and the field."""


def load_prompts(path: str | Path, tokenizer: Any | None) -> list[tuple[int, ...]]:
    """Token ids of every prompt in ``path`` (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"--prompts {str(path)!r}: no such file")
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{path}:{lineno}: not JSON ({exc})") from exc
        out.append(_prompt_ids(row, tokenizer, f"{path}:{lineno}"))
    if not out:
        raise PromptError(f"--prompts {str(path)!r}: no prompts")
    return out


def _prompt_ids(row: Any, tokenizer: Any | None, where: str) -> tuple[int, ...]:
    if not isinstance(row, dict):
        raise PromptError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise PromptError(f"{where}: field 'input_ids' = {str(ids)[:40]}: must be a non-empty list of token ids")
        return tuple(ids)
    key = "prompt" if "prompt" in row else "text" if "text" in row else None
    if key is None:
        raise PromptError(f"{where}: needs one of the fields 'input_ids', 'prompt', 'text'")
    text = row[key]
    if not isinstance(text, str) or not text:
        raise PromptError(f"{where}: field {key!r} = {text!r}: must be a non-empty string")
    if tokenizer is None:
        raise PromptError(f"{where}: field {key!r} needs a tokenizer, and the model has none (use 'input_ids')")
    if key == "prompt" and getattr(tokenizer, "chat_template", None):
        ids = chat_template_ids(tokenizer, user_turn(text))
    else:
        ids = tokenizer(text)["input_ids"]
    return tuple(int(t) for t in ids)
