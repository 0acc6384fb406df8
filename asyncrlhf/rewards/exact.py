"""Exact-match reward: the response is the answer, then EOS."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncrlhf.rewards._tokens import (
    as_padded_patterns,
    best_of_variants,
    check_generated_ids,
    first_true_index,
    has_variants,
)

__all__ = ["exact_match_reward"]


def exact_match_reward(
    generated_ids: torch.Tensor,
    answers: torch.Tensor | Sequence[torch.Tensor | Sequence[torch.Tensor]],
    eos_token_id: int,
) -> torch.Tensor:
    """1.0 where the response before its first EOS equals the answer and an EOS follows.

    Args:
        generated_ids: LongTensor[B, L], response tokens only.
        answers: a list of B 1-D LongTensors, or a LongTensor[B, A] padded with a
            negative id. A list item may be a list of 1-D tensors: the tokenizations
            one answer can take (a BPE tokenizer's ``"42"`` and ``" 42"``); any counts.
        eos_token_id: the end-of-sequence token id.

    Returns:
        float32 Tensor[B] on ``generated_ids``' device. A response that never emits EOS
        scores 0.0 (it did not stop); an empty answer matches a response that starts
        with EOS.

    Example:
        >>> ids = torch.tensor([[4, 2, 0], [4, 5, 2], [4, 0, 0]])
        >>> exact_match_reward(ids, [torch.tensor([4])] * 3, eos_token_id=2).tolist()
        [1.0, 0.0, 0.0]
    """
    ids = check_generated_ids(generated_ids)
    if has_variants(answers):  # several tokenizations of one answer: the best counts
        return best_of_variants(exact_match_reward, ids, answers, eos_token_id)  # type: ignore[arg-type]
    batch, length = ids.shape
    padded, lengths = as_padded_patterns(answers, batch, ids.device, name="answers")  # (B, A)
    eos_pos = first_true_index(ids == eos_token_id)  # (B,)
    width = min(padded.shape[1], length)  # an answer longer than L fails on eos_pos anyway
    offsets = torch.arange(width, device=ids.device)
    agree = (ids[:, :width] == padded[:, :width]) | (offsets >= lengths[:, None])  # (B, width)
    hit = agree.all(dim=1) & (eos_pos == lengths) & (eos_pos < length)
    return hit.float()
