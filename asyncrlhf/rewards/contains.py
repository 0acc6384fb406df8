"""Pattern-containment reward: does the answer occur inside the response?

Reward 1.0 where a row's answer pattern occurs as a contiguous run of tokens inside
the response before its first EOS (the whole row when there is no EOS), else 0.0.

Two exact algorithms, chosen by device and by how dense the work is:

* **candidate filter** (CPU default). One pass compares every token with its row's
  pattern head; only the (usually few) positions that match are confirmed, by
  gathering their P-token windows. Cost ≈ two passes over the tokens plus O(K·P)
  for K candidates, instead of the O(B·L·P) a sliding-window ``unfold`` costs.
  ``nonzero`` sizes its output from the data, which is a device sync on CUDA.
* **column scan** (CUDA, and CPU when candidates are dense). For each pattern offset
  j, compare the whole batch shifted by j against column j of the patterns and AND
  into a running match map: P vectorised passes, no sync, no B·L·P intermediate.
  Adversarial inputs (a response made of the pattern's head repeated) make every
  position a candidate; the filter then hands over to this scan, so they cost no
  more than the scan.
"""

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

__all__ = ["tensor_native_reward"]

# Above this share of candidate positions the gather-based confirmation (K·P random
# reads) costs more than the P contiguous passes of the column scan.
_DENSE_CANDIDATE_SHARE = 1 / 16


def tensor_native_reward(
    generated_ids: torch.Tensor,
    answer_patterns: torch.Tensor | Sequence[torch.Tensor | Sequence[torch.Tensor]],
    eos_token_id: int,
) -> torch.Tensor:
    """1.0 where each row's pattern occurs in its response before the first EOS.

    Args:
        generated_ids: LongTensor[B, L], response tokens only.
        answer_patterns: a list of B 1-D LongTensors, or a LongTensor[B, P] padded
            with a negative id. A list item may be a list of 1-D tensors (the
            tokenizations one answer can take); the row scores 1.0 if any occurs.
        eos_token_id: the end-of-sequence token id.

    Returns:
        float32 Tensor[B] on ``generated_ids``' device. An empty pattern, or one longer
        than the trimmed response, gives 0.0.

    Example:
        >>> ids = torch.tensor([[5, 7, 8, 2, 9], [7, 8, 2, 5, 5]])
        >>> tensor_native_reward(ids, [torch.tensor([7, 8]), torch.tensor([5, 5])], 2).tolist()
        [1.0, 0.0]
    """
    ids = check_generated_ids(generated_ids)
    if has_variants(answer_patterns):  # several tokenizations of one answer: the best counts
        return best_of_variants(tensor_native_reward, ids, answer_patterns, eos_token_id)  # type: ignore[arg-type]
    batch, length = ids.shape
    patterns, lengths = as_padded_patterns(answer_patterns, batch, ids.device)  # (B, P), (B,)
    if patterns.shape[1] == 0 or length == 0:
        return torch.zeros(batch, dtype=torch.float32, device=ids.device)
    eos_pos = first_true_index(ids == eos_token_id)  # (B,), L where no EOS
    if ids.is_cuda:
        return _column_scan(ids, patterns, lengths, eos_pos)
    return _candidate_filter(ids, patterns, lengths, eos_pos)


def _column_scan(
    ids: torch.Tensor,
    patterns: torch.Tensor,
    lengths: torch.Tensor,
    eos_pos: torch.Tensor,
    first_column: torch.Tensor | None = None,
    min_length: int = 0,
) -> torch.Tensor:
    """Exact scan: P passes, no sync. ``first_column`` (B, L) reuses an offset-0 compare;
    ``min_length`` (a lower bound on every pattern's length, known on the host) skips
    the wildcard pass for offsets every pattern covers."""
    length = ids.shape[1]
    width = min(patterns.shape[1], length)  # a longer pattern can never fit anyway
    match = ids == patterns[:, :1] if first_column is None else first_column  # (B, L), by window start
    for j in range(1, width):
        column = ids[:, j:] == patterns[:, j : j + 1]  # (B, L - j)
        if j >= min_length:
            column |= (lengths <= j)[:, None]  # offsets past a row's pattern match anything
        match[:, : length - j] &= column
    # A start s is valid when its window ends before the first EOS (which also keeps
    # the never-written tail columns L - j … L - 1 out for rows with a longer pattern).
    starts = torch.arange(length, device=ids.device)
    fits = starts[None, :] + lengths[:, None] <= eos_pos[:, None]  # (B, L)
    hit = (match & fits).any(dim=1) & (lengths > 0)
    return hit.float()


def _candidate_filter(
    ids: torch.Tensor, patterns: torch.Tensor, lengths: torch.Tensor, eos_pos: torch.Tensor
) -> torch.Tensor:
    batch, length = ids.shape
    width = patterns.shape[1]
    # Padding (-1) never equals a token id, so empty patterns produce no candidate.
    candidates = ids == patterns[:, :1]  # (B, L)
    # Host reads (a sync on an accelerator; this path runs on the CPU only).
    if int(torch.count_nonzero(candidates)) > _DENSE_CANDIDATE_SHARE * batch * length:
        return _column_scan(ids, patterns, lengths, eos_pos, candidates, int(lengths.min()))
    rows, starts = candidates.nonzero(as_tuple=True)  # (K,), (K,)
    offsets = torch.arange(width, device=ids.device)
    cols = (starts[:, None] + offsets).clamp_(max=length - 1)  # (K, P)
    windows = ids[rows[:, None], cols]  # (K, P)
    row_lengths = lengths[rows]  # (K,)
    agree = (windows == patterns[rows]) | (offsets >= row_lengths[:, None])  # (K, P)
    hit = agree.all(dim=1) & (starts + row_lengths <= eos_pos[rows])  # (K,)
    rewards = torch.zeros(batch, dtype=torch.float32, device=ids.device)
    return rewards.scatter_reduce_(0, rows, hit.float(), reduce="amax")
