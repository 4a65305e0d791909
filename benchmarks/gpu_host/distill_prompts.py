"""Prompts for the DistillSparse GPU run: held-out = the 40 fidelity prompts (written by hand, never trained
on); training = seeded prompts from templates of the same four kinds (math, reasoning, coding, story), as
many as the run asks for. Why templates: the repo holds 60 hand-written prompts and a run trains on a
thousand rollouts or more; a held-out prompt is never a training prompt (checked), so held-out acceptance
is measured on prompts the adapter never saw, though of the same kinds (as an RL run's prompts would be).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

HELDOUT = Path(__file__).resolve().parents[1] / "fidelity" / "prompts.jsonl"

_NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Diego", "Sofia", "Ivan", "Chloe", "Malik"]
_ITEMS = ["notebooks", "apples", "tickets", "bricks", "candles", "books", "shirts", "plants", "cables", "jars"]
_TOPICS = ["photosynthesis", "the water cycle", "compound interest", "how vaccines work", "plate tectonics",
           "why the sky is blue", "how a refrigerator works", "the French Revolution", "binary numbers",
           "how bridges carry loads", "the immune system", "supply and demand", "how GPS finds a position",
           "the life cycle of a star", "how bees make honey", "why seasons change"]
_TASKS = ["reverses a linked list", "checks whether a string is a palindrome", "merges two sorted lists",
          "counts word frequencies in a text", "finds the longest increasing subsequence", "parses a CSV line",
          "implements binary search", "computes the n-th Fibonacci number iteratively", "flattens a nested list",
          "validates an email address with simple rules", "rotates a matrix by 90 degrees", "implements an LRU cache"]
_LANGS = ["Python", "JavaScript", "Go", "Rust", "C", "Java"]
_SETTINGS = ["a lighthouse on a stormy coast", "a space station orbiting Jupiter", "a small bakery in Lisbon",
             "a desert caravan", "a library that never closes", "a mountain village in winter", "an underwater city",
             "a train crossing Siberia", "a robot repair shop", "a forest where it always rains"]
_HEROES = ["a retired detective", "a curious child", "an old sailor", "a young inventor", "a lonely robot",
           "a street musician", "a botanist", "a night-shift nurse", "a chess prodigy", "a cartographer"]


def _math(r: random.Random) -> str:
    a, b, c = r.randint(3, 19), round(r.uniform(0.5, 9.5), 2), r.randint(2, 9)
    return r.choice([
        f"{r.choice(_NAMES)} buys {a} {r.choice(_ITEMS)} at ${b} each and {c} more at ${round(b * 1.5, 2)} each. "
        f"How much does she spend in total? Show every step.",
        f"A tank holds {a * 100} litres and drains at {c * 7} litres per minute while a pipe adds {c * 3} litres per "
        f"minute. How long until it is empty? Explain step by step.",
        f"A rectangle's length is {c} cm more than {a % 5 + 2} times its width and its perimeter is {a * 12} cm. "
        f"Find its area, step by step.",
        f"Solve for x: {a}x + {c * 3} = {a * c + 40}. Then check your answer and explain each step.",
    ])


def _reasoning(r: random.Random) -> str:
    n1, n2, n3 = r.sample(_NAMES, 3)
    return r.choice([
        f"{n1}, {n2} and {n3} each own a different pet: a cat, a dog or a parrot. {n1} is allergic to fur and "
        f"{n2} does not own the dog. Who owns which pet? Reason it through carefully.",
        f"Explain {r.choice(_TOPICS)} to a curious teenager, then list three common misconceptions about it.",
        f"Compare the arguments for and against {r.choice(['remote work', 'nuclear power', 'school uniforms', 'public transport', 'four-day weeks'])} "
        f"and give a balanced conclusion.",
        f"If every {r.choice(_ITEMS)[:-1]} weighs {r.randint(2, 9)} units and a box holds at most {r.randint(20, 60)} units, "
        f"how would you pack {r.randint(10, 40)} of them into the fewest boxes? Explain your reasoning.",
    ])


def _coding(r: random.Random) -> str:
    return (f"Write a {r.choice(_LANGS)} function that {r.choice(_TASKS)}. Explain how it works, give its time "
            f"complexity and show {r.randint(2, 4)} example calls with their outputs.")


def _story(r: random.Random) -> str:
    return r.choice([
        f"Write a story about {r.choice(_HEROES)} in {r.choice(_SETTINGS)}. Include dialogue and a surprising ending.",
        f"Describe a day in the life of {r.choice(_HEROES)} who lives in {r.choice(_SETTINGS)}, hour by hour.",
        f"Write a letter from {r.choice(_HEROES)} to an old friend, telling what happened in {r.choice(_SETTINGS)}.",
    ])


KINDS = (_math, _reasoning, _coding, _story)


def heldout_prompts(path: Path = HELDOUT) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def training_prompts(n: int, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    """``n`` distinct prompts, the kinds in turn, none in ``exclude``; raises when the templates run dry."""
    r, out, seen = random.Random(seed), [], set(exclude)
    for attempt in range(50 * n + 100):
        if len(out) == n:
            break
        text = KINDS[attempt % len(KINDS)](r)  # by attempt: a kind whose templates run dry stops holding up the rest
        if text not in seen:
            seen.add(text)
            out.append(text)
    if len(out) < n:
        raise ValueError(f"n_train_prompts = {n}: the templates gave only {len(out)} distinct prompts")
    return out


__all__ = ["HELDOUT", "heldout_prompts", "training_prompts"]
