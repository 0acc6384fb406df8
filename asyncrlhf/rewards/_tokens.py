"""Token-level helpers shared by the tensor-native rewards.

All of them stay on the input's device and never read tensor data on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from asyncrlhf._checks import check_integer, check_rank, check_tensor

__all__ = ["as_padded_patterns", "best_of_variants", "check_generated_ids", "first_true_index", "has_variants"]


def check_generated_ids(generated_ids: object) -> torch.Tensor:
    """Validate ``generated_ids`` as a LongTensor-like [B, L] of token ids."""
    ids = check_tensor("generated_ids", generated_ids)
    check_rank("generated_ids", ids, 2)
    check_integer("generated_ids", ids)
    return ids


def first_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True in each row of ``mask`` (B, L); L where there is none.

    One reduction: ``max`` over a bool row returns the first maximal index, and the
    value tells whether any element was True.

    >>> first_true_index(torch.tensor([[False, True, True], [False, False, False]])).tolist()
    [1, 3]
    """
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    found, index = mask.max(dim=1)  # (B,), (B,)
    return torch.where(found, index, torch.full_like(index, mask.shape[1]))


def _from_tensor(
    patterns: torch.Tensor, batch_size: int, device: torch.device, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    check_rank(name, patterns, 2)
    check_integer(name, patterns)
    if patterns.shape[0] != batch_size:
        raise ValueError(f"{name} has {patterns.shape[0]} rows but generated_ids has {batch_size}")
    padded = patterns.to(device=device, dtype=torch.long)
    lengths = first_true_index(padded < 0)
    # Everything after a row's first negative id is padding, whatever it holds.
    beyond = torch.arange(padded.shape[1], device=device) >= lengths[:, None]
    return padded.masked_fill(beyond, -1), lengths


def as_padded_patterns(
    patterns: torch.Tensor | Sequence[torch.Tensor],
    batch_size: int,
    device: torch.device,
    name: str = "answer_patterns",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise per-row token patterns to a padded tensor and their lengths.

    Args:
        patterns: a list of ``batch_size`` 1-D integer tensors, or a LongTensor[B, P]
            where a row's pattern is its prefix of non-negative ids (any negative id
            ends it, so ``-1`` is the conventional padding).
        batch_size: B, the number of rows the patterns must match.
        device: the device of the token ids.
        name: the argument's name, for error messages.

    Returns:
        ``(padded, lengths)``: LongTensor[B, P] padded with -1, and LongTensor[B].
    """
    if isinstance(patterns, torch.Tensor):
        return _from_tensor(patterns, batch_size, device, name)
    if not isinstance(patterns, Sequence) or isinstance(patterns, str | bytes):
        raise TypeError(f"{name} must be a list of 1-D tensors or a 2-D tensor, got {type(patterns).__name__}")
    if len(patterns) != batch_size:
        raise ValueError(f"{name} has {len(patterns)} patterns but generated_ids has {batch_size} rows")
    try:
        # Validate in bulk: cat refuses non-tensors and mixed ranks, and its result
        # shows a float (dtype promotion) or a 2-D/0-D item. Per-item checks run only
        # to name the offending item: ~0.6 µs per pattern adds up at B = 256.
        flat = torch.cat(list(patterns)) if batch_size else torch.empty(0, dtype=torch.long)
        bulk_ok = flat.dim() == 1
    except (TypeError, RuntimeError):
        bulk_ok = False
    if not bulk_ok or flat.is_floating_point() or flat.is_complex() or flat.dtype == torch.bool:
        for i, pattern in enumerate(patterns):
            check_tensor(f"{name}[{i}]", pattern)
            check_rank(f"{name}[{i}]", pattern, 1)
            check_integer(f"{name}[{i}]", pattern)
        # Valid items that cat still refused (e.g. spread over devices): move them first.
        flat = torch.cat([p.to(device=device, dtype=torch.long) for p in patterns])
    # One concatenation and one scatter instead of B small pads: the list form is the
    # seed's, and per-row tensor ops would dominate the reward's cost.
    sizes = [pattern.shape[0] for pattern in patterns]
    width = max(sizes, default=0)
    padded = torch.full((batch_size, width), -1, dtype=torch.long, device=device)
    lengths = torch.tensor(sizes, dtype=torch.long).to(device)
    if width == 0:
        return padded, lengths
    flat = flat.to(device=device, dtype=torch.long)  # (ΣP,)
    row = torch.repeat_interleave(torch.arange(batch_size, device=device), lengths)  # (ΣP,)
    col = torch.arange(flat.shape[0], device=device) - (torch.cumsum(lengths, 0) - lengths)[row]
    padded[row, col] = flat
    return padded, lengths


def has_variants(patterns: object) -> bool:
    """Whether a list of per-row patterns gives some row several (a list or tuple of
    1-D tensors: the tokenizations one answer can take)."""
    return (
        isinstance(patterns, Sequence)
        and not isinstance(patterns, torch.Tensor)
        and any(isinstance(p, list | tuple) for p in patterns)
    )


def best_of_variants(
    reward: Callable[[torch.Tensor, Sequence[torch.Tensor], int], torch.Tensor],
    ids: torch.Tensor,
    patterns: Sequence[torch.Tensor | Sequence[torch.Tensor]],
    eos_token_id: int,
) -> torch.Tensor:
    """``reward`` where each row scores the best of its patterns: every (row, variant)
    pair becomes a row of one batch (an index_select of the ids), scored in one call,
    then reduced per row with a max. Stays on the ids' device; the pair layout comes
    from the list's structure, not from tensor data.
    """
    if len(patterns) != ids.shape[0]:
        raise ValueError(f"answers has {len(patterns)} items but generated_ids has {ids.shape[0]} rows")
    flat: list[torch.Tensor] = []
    owners: list[int] = []
    for row, variants in enumerate(patterns):
        group = list(variants) if isinstance(variants, list | tuple) else [variants]
        if not group:
            raise ValueError(f"answers[{row}] has no variant")
        flat += group
        owners += [row] * len(group)
    owner = torch.tensor(owners, dtype=torch.long).to(ids.device)
    scores = reward(ids.index_select(0, owner), flat, eos_token_id)  # (ΣK,)
    best = torch.zeros(ids.shape[0], dtype=scores.dtype, device=ids.device)
    return best.scatter_reduce(0, owner, scores, reduce="amax", include_self=False)
