"""What a verifiable task provides: prompts with token-id answers, and an eval set."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Problem", "Task", "answer_variants", "encode_problem"]


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


@runtime_checkable
class Task(Protocol):
    """A stream of training problems and a fixed held-out evaluation set."""

    def train_problems(self) -> Iterator[Problem]:
        """An endless (or long) iterator of training problems, seeded."""
        ...

    def eval_problems(self) -> list[Problem]:
        """The held-out problems, disjoint from training ones where the task allows."""
        ...


def encode_problem(tokenizer: object, prompt_id: Hashable, prompt: str, answer: str, variants: bool = False) -> Problem:
    """Tokenise a prompt (with BOS) and an answer (no specials) into a Problem; with
    ``variants``, also the answer's other tokenizations (:func:`answer_variants`)."""
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    prompt_ids = bos + tokenizer.encode(prompt, add_special_tokens=False)
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
