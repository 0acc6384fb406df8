"""What a verifiable task provides: prompts with token-id answers, and an eval set."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Problem", "Task", "encode_problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One prompt and its verifiable answer, both already tokenised.

    Attributes:
        prompt_id: stable key (the GRPO group key).
        prompt: the prompt text, for logs.
        answer: the answer text, for logs.
        prompt_ids: LongTensor[P] (BOS included).
        answer_ids: LongTensor[A] (no EOS: rewards check the EOS themselves).
    """

    prompt_id: Hashable
    prompt: str
    answer: str
    prompt_ids: torch.Tensor
    answer_ids: torch.Tensor


@runtime_checkable
class Task(Protocol):
    """A stream of training problems and a fixed held-out evaluation set."""

    def train_problems(self) -> Iterator[Problem]:
        """An endless (or long) iterator of training problems, seeded."""
        ...

    def eval_problems(self) -> list[Problem]:
        """The held-out problems, disjoint from training ones where the task allows."""
        ...


def encode_problem(tokenizer: object, prompt_id: Hashable, prompt: str, answer: str) -> Problem:
    """Tokenise a prompt (with BOS) and an answer (no specials) into a Problem."""
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    prompt_ids = bos + tokenizer.encode(prompt, add_special_tokens=False)
    answer_ids = tokenizer.encode(answer, add_special_tokens=False)
    return Problem(
        prompt_id,
        prompt,
        answer,
        torch.tensor(prompt_ids, dtype=torch.long),
        torch.tensor(answer_ids, dtype=torch.long),
    )
