"""Single-token reward: does the target token appear before the first EOS?"""

from __future__ import annotations

import torch

from asyncrlhf._checks import check_integer, check_rank, check_tensor
from asyncrlhf.rewards._tokens import check_generated_ids, first_true_index

__all__ = ["gpu_reward_simple"]


def gpu_reward_simple(generated_ids: torch.Tensor, target_token_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1.0 where ``target_token_ids[b]`` appears in row b before its first EOS.

    Args:
        generated_ids: LongTensor[B, L], response tokens only.
        target_token_ids: LongTensor[B], one target token per row.
        eos_token_id: the end-of-sequence token id.

    Returns:
        float32 Tensor[B] on ``generated_ids``' device.

    Example:
        >>> ids = torch.tensor([[3, 9, 2], [3, 2, 9]])
        >>> gpu_reward_simple(ids, torch.tensor([9, 9]), eos_token_id=2).tolist()
        [1.0, 0.0]
    """
    ids = check_generated_ids(generated_ids)
    targets = check_tensor("target_token_ids", target_token_ids)
    check_rank("target_token_ids", targets, 1)
    check_integer("target_token_ids", targets)
    if targets.shape[0] != ids.shape[0]:
        raise ValueError(f"target_token_ids has {targets.shape[0]} entries but generated_ids has {ids.shape[0]} rows")
    first_hit = first_true_index(ids == targets.to(ids.device)[:, None])  # (B,), L if absent
    eos_pos = first_true_index(ids == eos_token_id)  # (B,)
    return (first_hit < eos_pos).float()
