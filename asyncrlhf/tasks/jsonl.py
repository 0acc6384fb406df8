"""Prompt/answer pairs from a JSONL file, for real use beyond the synthetic task."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.tasks.base import Problem, encode_problem

__all__ = ["JsonlTask"]


class JsonlTask:
    """Each line: ``{"prompt": str, "answer": str}`` (an optional ``"id"`` too).

    A seeded share of the lines (``eval_fraction``, drawn by ``eval_seed``, default
    ``seed``) is held out for evaluation, or a separate ``eval_path`` file gives the
    evaluation set. ``seed`` orders the training stream.
    """

    def __init__(
        self,
        tokenizer: object,
        path: str | Path,
        eval_path: str | Path | None = None,
        eval_fraction: float = 0.1,
        seed: int = 0,
        eval_seed: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.seed = check_nonnegative_int("seed", seed)
        split_seed = seed if eval_seed is None else check_nonnegative_int("eval_seed", eval_seed)
        rows = self._read(Path(path))
        if eval_path is not None:
            self._train, self._eval = rows, self._read(Path(eval_path))
        else:
            if not 0.0 <= eval_fraction < 1.0:
                raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}")
            shuffled = rows[:]
            random.Random(split_seed).shuffle(shuffled)
            cut = int(len(shuffled) * eval_fraction)
            self._eval, self._train = shuffled[:cut], shuffled[cut:]
        if not self._train:
            raise ValueError(f"path {path} leaves no training problems")

    @staticmethod
    def _read(path: Path) -> list[tuple[str, str, str]]:
        if not path.is_file():
            raise FileNotFoundError(f"task path {path} does not exist")
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                rows.append((str(item.get("id", f"{path.name}:{lineno}")), str(item["prompt"]), str(item["answer"])))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                raise ValueError(f"{path}:{lineno}: expected {{'prompt': ..., 'answer': ...}}: {err}") from err
        return rows

    def train_problems(self) -> Iterator[Problem]:
        rng = random.Random(self.seed + 1)
        while True:
            pid, prompt, answer = self._train[rng.randrange(len(self._train))]
            yield encode_problem(self.tokenizer, pid, prompt, answer)

    def eval_problems(self) -> list[Problem]:
        return [encode_problem(self.tokenizer, pid, prompt, answer) for pid, prompt, answer in self._eval]
