"""Templated arithmetic word problems in GSM8K's format: a question, and a worked answer
ending in ``#### N``. Deterministic from a seed; the shipped files under
``experiments/data/word_problems/`` are this generator's output::

    python -m asyncrlhf.tasks.word_problems experiments/data/word_problems

Example:
    >>> problem = generate(1, seed=3)[0]
    >>> problem["answer"].rsplit("#### ", 1)[1] == str(eval(problem["answer"].split(" =")[0]))
    True
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

__all__ = ["generate", "write_splits"]

NAMES = ["Tom", "Ana", "Lee", "Sam", "Mia", "Raj", "Eva", "Ben", "Zoe", "Kim"]
ITEMS = ["apples", "books", "coins", "cards", "pens", "shells", "stamps", "eggs"]
TEMPLATES = [  # (question, operator): a + b or a - b with a > b
    ("{n} has {a} {i}. {n} gets {b} more. How many {i} does {n} have now?", "+"),
    ("{n} had {a} {i} and found {b} more. How many {i} does {n} have?", "+"),
    ("A box holds {a} {i}. {b} more {i} are put in. How many {i} are in the box?", "+"),
    ("{n} has {a} {i}. {n} gives {b} away. How many {i} are left?", "-"),
    ("There were {a} {i} on a table. {n} took {b} of them. How many {i} remain?", "-"),
]


def generate(count: int, seed: int = 0, low: int = 10, high: int = 99) -> list[dict[str, str]]:
    """``count`` problems ``{"question", "answer"}``, operands in ``[low, high]``."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        question, op = rng.choice(TEMPLATES)
        a, b = rng.randint(low, high), rng.randint(low, high)
        if op == "-" and a < b:
            a, b = b, a
        result = a + b if op == "+" else a - b
        text = question.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b)
        out.append({"question": text, "answer": f"{a} {op} {b} = {result}\n#### {result}"})
    return out


def write_splits(folder: Path, train: int = 4000, test: int = 300, seed: int = 0) -> None:
    """``train.jsonl`` and ``test.jsonl`` in ``folder``: disjoint questions."""
    problems = generate(train * 2 + test, seed)
    seen: set[str] = set()
    unique = [p for p in problems if not (p["question"] in seen or seen.add(p["question"]))]  # type: ignore[func-returns-value]
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("test", unique[:test]), ("train", unique[test : test + train])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    write_splits(Path(sys.argv[1]))
