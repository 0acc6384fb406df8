"""Prompts and answers from a local JSONL or Parquet file, read with Hugging Face
``datasets`` (offline: ``data_files=``, nothing downloaded), formatted with the
tokenizer's chat template when it has one."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.tasks.base import LongPrompts, Problem, answer_variants, plain_prompt_ids
from asyncrlhf.tasks.jsonl import json_line, read_utf8, unrepresentable

__all__ = ["DatasetTask", "read_records"]


def read_records(path: Path, keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` per row of a ``.jsonl``/``.json`` or ``.parquet`` file, each
    with ``keys`` as non-empty strings; a ValueError naming the file, the line (JSONL) or
    row (Parquet), and the field otherwise."""
    import datasets

    if not path.is_file():
        raise FileNotFoundError(f"task path {path} does not exist")
    kind = "parquet" if path.suffix == ".parquet" else "json"
    if kind == "json":  # checked here first: datasets' own errors name no line
        text = read_utf8(path).splitlines()
        lines = [n for n, line in enumerate(text, 1) if line.strip()]
        for n in lines:
            json_line(path, n, text[n - 1])
        if not lines:
            raise ValueError(f"{path}: empty file (no records)")
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-data-") as cache:  # no copy left in ~/.cache
        try:
            data = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache)
        except Exception as err:
            raise ValueError(f"{path}: could not be read as {kind}: {type(err).__name__}: {err}") from None
        rows = data.to_list()
    if not rows:
        raise ValueError(f"{path}: empty file (no records)")
    missing = [k for k in keys if k not in data.column_names]
    if missing:
        raise ValueError(f"{path}: no field {missing[0]!r} in any record (fields: {', '.join(data.column_names)})")
    out = []
    for i, row in enumerate(rows):
        where = f"{path}:{lines[i]}" if kind == "json" else f"{path}: row {i}"
        for key in keys:
            value = row.get(key)
            if value is None:
                raise ValueError(f"{where}: missing field {key!r}")
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.60}")
        out.append((where, row))
    return out


class DatasetTask:
    """A verifiable task from a dataset file.

    Args:
        tokenizer: a Hugging Face tokenizer; its chat template, if any, formats prompts.
        path: ``.jsonl`` (or ``.json``) or ``.parquet``.
        prompt_key, answer_key: the fields holding the prompt and the reference answer
            (GSM8K: ``question``, ``answer``; a worked answer ending ``#### 72`` is fine
            for the math verifier).
        eval_path: a separate held-out file; else ``eval_fraction`` of ``path`` is held
            out (drawn by ``eval_seed``, default ``seed``).
        system_prompt: a system message before the user's (chat template only).
        chat_template: apply the tokenizer's template (None: when it has one).
        max_prompt_tokens: longer prompts are dropped (``long_prompts="drop"``, counted in
            :attr:`dropped`) or refused (``"refuse"``).
        answer_variants: answers also match their other tokenizations (tensor rewards).
    """

    def __init__(
        self,
        tokenizer: Any,
        path: str | Path,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        eval_path: str | Path | None = None,
        eval_fraction: float = 0.1,
        system_prompt: str | None = None,
        chat_template: bool | None = None,
        max_prompt_tokens: int | None = None,
        long_prompts: Literal["drop", "refuse"] = "drop",
        seed: int = 0,
        eval_seed: int | None = None,
        answer_variants: bool = False,
    ) -> None:
        self.tokenizer, self.keys, self.seed = tokenizer, (prompt_key, answer_key), check_nonnegative_int("seed", seed)
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat_template and not has_template:
            raise ValueError("chat_template is on but the tokenizer has no chat template")
        self.templated = has_template if chat_template is None else chat_template
        if system_prompt is not None and not self.templated:
            raise ValueError("system_prompt needs a chat template (the tokenizer has none, or chat_template is off)")
        self.system_prompt, self.variants = system_prompt, answer_variants
        self.long = LongPrompts(max_prompt_tokens, long_prompts)
        train = self._problems(Path(path))
        if eval_path is not None:
            self._train, self._eval = train, self._problems(Path(eval_path))
        else:
            if not 0.0 <= eval_fraction < 1.0:
                raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}")
            random.Random(seed if eval_seed is None else eval_seed).shuffle(train)
            cut = int(len(train) * eval_fraction)
            if eval_fraction > 0 and cut == 0:
                raise ValueError(
                    f"{path}: {len(train)} usable problem(s) at eval_fraction={eval_fraction} hold out "
                    "none for evaluation: give more, or an eval_path"
                )
            self._eval, self._train = train[:cut], train[cut:]
        if not self._train:
            raise ValueError(f"{path}: no training problems left")

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's token ids: the chat template's, generation prompt included (what
        ``apply_chat_template(..., add_generation_prompt=True)`` gives), or BOS + text."""
        tok = self.tokenizer
        if self.templated:
            messages = [{"role": "user", "content": prompt}]
            if self.system_prompt is not None:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))
        return plain_prompt_ids(tok, prompt)

    @property
    def dropped(self) -> int:
        """Prompts dropped for being over ``max_prompt_tokens``."""
        return self.long.dropped

    def _problems(self, path: Path) -> list[Problem]:
        problems = []
        for where, row in read_records(path, self.keys):
            prompt, answer = row[self.keys[0]], row[self.keys[1]]
            for key, text in zip(self.keys, (prompt, answer), strict=True):
                unknown = unrepresentable(self.tokenizer, text)
                if unknown:
                    raise ValueError(f"{where}: field {key!r} has characters the tokenizer cannot represent: {unknown}")
            ids = self.prompt_ids(prompt)
            if not self.long.keep(where, len(ids)):
                continue
            answer_ids = self.tokenizer.encode(answer, add_special_tokens=False)
            others = answer_variants(self.tokenizer, prompt, answer)[1:] if self.variants else []
            problems.append(
                Problem(
                    row.get("id", where),
                    prompt,
                    answer,
                    torch.tensor(ids, dtype=torch.long),
                    torch.tensor(answer_ids, dtype=torch.long),
                    tuple(torch.tensor(v, dtype=torch.long) for v in others),
                )
            )
        self.long.done(path, len(problems))
        return problems

    def train_problems(self) -> Iterator[Problem]:
        rng = random.Random(self.seed + 1)
        while True:
            yield self._train[rng.randrange(len(self._train))]

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)
