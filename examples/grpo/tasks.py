"""The toy task: two-number additions with a verifiable exact-match reward.

"What is 17+25? Answer with the number." is rewarded 1.0 when the last integer in the
completion is 42, else 0.0. Problems are drawn from a seeded generator, so a run is
reproducible and needs no data file.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from sparrow_server.engine.chat_template import chat_template_ids, user_turn

QUESTION = "What is {a}+{b}? Answer with the number."
DEFAULT_MAX_OPERAND = 20
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int


def solved_examples(count: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND) -> str:
    """``count`` worked additions, one per line: a few-shot preamble that makes the prompt long enough
    for a KV budget to drop pages (the bare question is ~43 tokens, under every schedule's first budget)."""
    rng = random.Random(seed)
    pairs = [(rng.randint(1, max_operand), rng.randint(1, max_operand)) for _ in range(count)]
    return "".join(f"{a}+{b} = {a + b}\n" for a, b in pairs)


def arithmetic_problems(count: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND,
                        context_examples: int = 0) -> list[Problem]:
    """``count`` additions of operands in ``[1, max_operand]``, the same for the same ``seed``; with
    ``context_examples``, each question follows that many worked additions (its own, seeded)."""
    if count < 1:
        raise ValueError(f"count = {count}: must be >= 1")
    if context_examples < 0:
        raise ValueError(f"context_examples = {context_examples}: must be >= 0")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        # the examples' own seed: the questions stay those of the bare task with the same seed
        preamble = solved_examples(context_examples, seed * 1_000_003 + i, max_operand) if context_examples else ""
        out.append(Problem(preamble + QUESTION.format(a=a, b=b), a + b))
    return out


def prompt_ids(tokenizer: Any, problem: Problem) -> list[int]:
    """The chat-formatted prompt as token ids (generation prompt appended)."""
    return chat_template_ids(tokenizer, user_turn(problem.question))


def last_integer(text: str) -> int | None:
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


def exact_match_reward(completion: str, problem: Problem) -> float:
    """1.0 when the completion's last integer is the answer, else 0.0."""
    return 1.0 if last_integer(completion) == problem.answer else 0.0
