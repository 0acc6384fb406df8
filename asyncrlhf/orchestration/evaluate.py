"""Held-out evaluation: greedy accuracy on a task's evaluation problems."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncrlhf.rewards import exact_match_reward
from asyncrlhf.rollout.base import RolloutEngine
from asyncrlhf.tasks.base import Problem

__all__ = ["evaluate_accuracy", "pad_responses"]


def pad_responses(responses: Sequence[torch.Tensor], pad_token_id: int) -> torch.Tensor:
    """Right-pad 1-D response tensors into LongTensor[B, R] on their device."""
    return torch.nn.utils.rnn.pad_sequence(list(responses), batch_first=True, padding_value=pad_token_id)


def evaluate_accuracy(
    engine: RolloutEngine, problems: Sequence[Problem], eos_token_id: int, pad_token_id: int, batch_size: int = 256
) -> float:
    """Share of ``problems`` whose greedy response is exactly the answer, then EOS."""
    hits = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        samples = engine.generate([p.prompt_ids for p in chunk])
        ids = pad_responses([s.response_ids for s in samples], pad_token_id)
        answers = [p.answer_ids.to(ids.device) for p in chunk]
        hits += float(exact_match_reward(ids, answers, eos_token_id).sum())
    return hits / max(len(problems), 1)
