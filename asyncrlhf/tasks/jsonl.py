"""Prompt/answer pairs from a JSONL file, for real use beyond the synthetic task."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.tasks.base import LongPrompts, Problem, encode_problem, plain_prompt_ids

__all__ = ["JsonlTask", "json_line", "read_utf8", "unrepresentable"]

Row = tuple[str, str, str]  # (id, prompt, answer)


class JsonlTask:
    """Each line: ``{"prompt": str, "answer": str}`` (an optional ``"id"`` too).

    A seeded share of the lines (``eval_fraction``, drawn by ``eval_seed``, default
    ``seed``) is held out for evaluation, or a separate ``eval_path`` file gives the
    evaluation set. ``seed`` orders the training stream. ``answer_variants``: each
    answer also matches its other tokenizations (see
    :func:`~asyncrlhf.tasks.base.answer_variants`), for subword tokenizers. A prompt over
    ``max_prompt_tokens`` (BOS included) is dropped or refused, as ``long_prompts`` says
    (:class:`~asyncrlhf.tasks.base.LongPrompts`).

    Every line is checked when the task is built, and a bad one is refused with its file,
    line and field: prompts and answers must be non-empty JSON strings (not ``null``,
    numbers or objects, which would otherwise be trained on as ``"None"`` or ``"3"``),
    and every character must be one the tokenizer can represent (else two different
    answers could encode to the same ``<unk>`` ids and compare equal). A held-out share
    that rounds to no problem is refused too: the run would report no accuracy.
    """

    def __init__(
        self,
        tokenizer: object,
        path: str | Path,
        eval_path: str | Path | None = None,
        eval_fraction: float = 0.1,
        seed: int = 0,
        eval_seed: int | None = None,
        answer_variants: bool = False,
        max_prompt_tokens: int | None = None,
        long_prompts: Literal["drop", "refuse"] = "drop",
    ) -> None:
        self.tokenizer, self.variants = tokenizer, answer_variants
        self.long = LongPrompts(max_prompt_tokens, long_prompts)
        self.seed = check_nonnegative_int("seed", seed)
        split_seed = seed if eval_seed is None else check_nonnegative_int("eval_seed", eval_seed)
        rows = self._read(Path(path))
        if eval_path is not None:
            self._train, self._eval = rows, self._read(Path(eval_path))
            if not self._eval:
                raise ValueError(f"{eval_path}: no evaluation problems in the file")
        else:
            if not 0.0 <= eval_fraction < 1.0:
                raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}")
            shuffled = rows[:]
            random.Random(split_seed).shuffle(shuffled)
            cut = int(len(shuffled) * eval_fraction)
            if eval_fraction > 0 and cut == 0:
                raise ValueError(
                    f"{path}: {len(rows)} problem(s) at eval_fraction={eval_fraction} hold out none for evaluation: "
                    f"give at least {int(1 / eval_fraction) + 1} lines, or an eval_path"
                )
            self._eval, self._train = shuffled[:cut], shuffled[cut:]
        if not self._train:
            raise ValueError(f"{path}: no training problems in the file")

    def _read(self, path: Path) -> list[Row]:
        if not path.is_file():
            raise FileNotFoundError(f"task path {path} does not exist")
        rows = []
        for lineno, line in enumerate(read_utf8(path).splitlines(), start=1):
            if line.strip():
                row = self._row(json_line(path, lineno, line), f"{path}:{lineno}", f"{path.name}:{lineno}")
                if self.long.keep(f"{path}:{lineno}", len(plain_prompt_ids(self.tokenizer, row[1]))):
                    rows.append(row)
        self.long.done(path, len(rows))
        return rows

    @property
    def dropped(self) -> int:
        """Prompts dropped for being over ``max_prompt_tokens``."""
        return self.long.dropped

    def _row(self, item: dict[str, Any], where: str, default_id: str) -> Row:
        pid = item.get("id", default_id)
        if isinstance(pid, bool) or not isinstance(pid, str | int):
            raise ValueError(f"{where}: field 'id' must be a string or an integer, got {_json(pid)}")
        fields = []
        for name in ("prompt", "answer"):
            if name not in item:
                raise ValueError(f"{where}: missing field {name!r} (expected {{'prompt': ..., 'answer': ...}})")
            value = item[name]
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: field {name!r} must be a non-empty string, got {_json(value)}")
            unknown = unrepresentable(self.tokenizer, value)
            if unknown:
                raise ValueError(f"{where}: field {name!r} has characters the tokenizer cannot represent: {unknown}")
            fields.append(value)
        return str(pid), fields[0], fields[1]

    def train_problems(self) -> Iterator[Problem]:
        rng = random.Random(self.seed + 1)
        while True:
            pid, prompt, answer = self._train[rng.randrange(len(self._train))]
            yield encode_problem(self.tokenizer, pid, prompt, answer, self.variants)

    def eval_problems(self) -> list[Problem]:
        return [encode_problem(self.tokenizer, *row, self.variants) for row in self._eval]


def unrepresentable(tokenizer: Any, text: str) -> str:
    """The characters of ``text`` the tokenizer maps to its unknown token (none: '')."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk not in tokenizer.encode(text, add_special_tokens=False):
        return ""
    bad = sorted({c for c in text if unk in tokenizer.encode(c, add_special_tokens=False)})
    return " ".join(repr(c) for c in bad) or repr(text[:40])


def read_utf8(path: Path) -> str:
    """The file's text, or a ValueError naming the first byte that is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        byte = err.object[err.start]
        raise ValueError(f"{path}: not UTF-8 text (byte {byte:#04x} at offset {err.start})") from None


def json_line(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One line's JSON object, or a ValueError naming the file and line."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{lineno}: not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(item, dict):
        raise ValueError(f"{path}:{lineno}: expected an object {{'prompt': ..., 'answer': ...}}, got {_json(item)}")
    return item


def _json(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
