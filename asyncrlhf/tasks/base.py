"""What a verifiable task provides: prompts with token-id answers, and an eval set."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = ["LongPrompts", "Problem", "Task", "answer_variants", "encode_problem", "plain_prompt_ids"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One prompt and its verifiable answer, both already tokenised.

    Attributes:
        prompt_id: stable key (the GRPO group key).
        prompt: the prompt text, for logs.
        answer: the answer text, for logs.
        prompt_ids: LongTensor[P] (BOS included).
        answer_ids: LongTensor[A] (no EOS: rewards check the EOS themselves).
        variants: other tokenizations of the same answer (a BPE tokenizer may write
            ``42`` as one token, or with a leading space, or split, in context); empty
            when the answer has one.
    """

    prompt_id: Hashable
    prompt: str
    answer: str
    prompt_ids: torch.Tensor
    answer_ids: torch.Tensor
    variants: tuple[torch.Tensor, ...] = ()

    @property
    def patterns(self) -> torch.Tensor | list[torch.Tensor]:
        """What a tensor-native reward matches: the answer's ids, or all its variants."""
        return [self.answer_ids, *self.variants] if self.variants else self.answer_ids

    def patterns_on(self, device: torch.device) -> torch.Tensor | list[torch.Tensor]:
        """:attr:`patterns` on ``device``."""
        patterns = self.patterns
        return [p.to(device) for p in patterns] if isinstance(patterns, list) else patterns.to(device)


@dataclass
class LongPrompts:
    """The prompt-length limit of a file-backed task: a prompt over ``limit`` tokens is
    dropped (counted in :attr:`dropped`, with one warning per file) or, with ``"refuse"``,
    a ValueError naming where it is. A 200,000-character prompt otherwise reached the
    model and failed the run allocating 40 GB."""

    limit: int | None = None
    policy: Literal["drop", "refuse"] = "drop"
    dropped: int = 0
    _long: list[str] = field(default_factory=list)

    def keep(self, where: str, tokens: int) -> bool:
        """Whether the prompt at ``where`` (``tokens`` long) is kept."""
        if self.limit is None or tokens <= self.limit:
            return True
        if self.policy == "refuse":
            raise ValueError(f"{where}: prompt has {tokens} tokens, over max_prompt_tokens={self.limit}")
        self._long.append(where)
        return False

    def done(self, path: Path, kept: int) -> None:
        """After reading ``path`` (``kept`` prompts kept): count, warn, or refuse a file
        with nothing left."""
        long, self._long = self._long, []
        self.dropped += len(long)
        if not kept and long:
            raise ValueError(f"{path}: all {len(long)} prompts are over max_prompt_tokens={self.limit}")
        if long:
            warnings.warn(
                f"{path}: dropped {len(long)} of {len(long) + kept} prompts over "
                f"max_prompt_tokens={self.limit} (first: {long[0]})",
                stacklevel=4,
            )


@runtime_checkable
class Task(Protocol):
    """A stream of training problems and a fixed held-out evaluation set."""

    def train_problems(self) -> Iterator[Problem]:
        """An endless (or long) iterator of training problems, seeded."""
        ...

    def eval_problems(self) -> list[Problem]:
        """The held-out problems, disjoint from training ones where the task allows."""
        ...


def plain_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """A prompt's token ids without a chat template: BOS (if the tokenizer has one) + text."""
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    return bos + tokenizer.encode(prompt, add_special_tokens=False)


def encode_problem(tokenizer: object, prompt_id: Hashable, prompt: str, answer: str, variants: bool = False) -> Problem:
    """Tokenise a prompt (with BOS) and an answer (no specials) into a Problem; with
    ``variants``, also the answer's other tokenizations (:func:`answer_variants`)."""
    prompt_ids = plain_prompt_ids(tokenizer, prompt)
    answer_ids = tokenizer.encode(answer, add_special_tokens=False)
    others = answer_variants(tokenizer, prompt, answer)[1:] if variants else []
    return Problem(
        prompt_id,
        prompt,
        answer,
        torch.tensor(prompt_ids, dtype=torch.long),
        torch.tensor(answer_ids, dtype=torch.long),
        tuple(torch.tensor(v, dtype=torch.long) for v in others),
    )


def answer_variants(tokenizer: Any, prompt: str, answer: str) -> list[list[int]]:
    """The token sequences a policy may emit for ``answer`` after ``prompt``, the plain
    encoding first: the answer alone, the answer as the tokenizer splits it after the
    prompt (BPE merges across the boundary), and with one leading space (``Ġ42``).
    Only those that decode back to the answer (spaces aside) are kept.

    Example:
        >>> from asyncrlhf.models import build_char_tokenizer
        >>> len(answer_variants(build_char_tokenizer(), "1+2=", "3"))  # "3" and " 3"
        2
    """
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    plain, in_context = encode(answer), []
    before, whole = encode(prompt), encode(prompt + answer)
    if whole[: len(before)] == before:
        in_context = whole[len(before) :]
    found: list[list[int]] = []
    for ids in (plain, in_context, encode(" " + answer)):
        if ids and ids not in found and tokenizer.decode(ids).strip() == answer.strip():
            found.append(ids)
    return found or [plain]
