"""GSPO: the clip on a sequence-level ratio.

Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. 5–7:

    s_i(θ) = (π_θ(y_i | x) / π_old(y_i | x))^(1/|y_i|) = exp(mean_t log r_{i,t})
    J      = mean_i min(s_i·Â_i, clip(s_i, 1 − ε_low, 1 + ε_high)·Â_i)

One length-normalised ratio per sequence, so a few runaway tokens cannot dominate the
update the way per-token ratios do on stale data; the paper clips it tightly
(ε_low = 3e-4, ε_high = 4e-4). Each sequence's term is spread over its tokens, so
``loss_agg="seq-mean-token-mean"`` is the paper's mean over sequences, and the default
``token-mean`` (as for every objective here) weighs sequences by length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrlhf.losses._common import (
    LossAgg,
    aggregate,
    check_clip_eps,
    check_loss_agg,
    clipped_surrogate,
    masked_mean,
    prepare_inputs,
    ratio_metrics,
    to_floats,
)
from asyncrlhf.losses.options import LossOptions, option
from asyncrlhf.losses.registry import register_policy_loss

__all__ = ["compute_gspo_loss"]


@dataclass
class GSPOOptions(LossOptions):
    """GSPO: the clip on a length-normalised sequence ratio (arXiv 2507.18071)."""

    clip_eps: float = option(3e-4, "ε_low of the sequence clip.", gt=0, lt=1)
    clip_eps_high: float | None = option(4e-4, "ε_high of the sequence clip.", gt=0, lt=1)


@register_policy_loss("gspo", row_separable=True, options=GSPOOptions)
def compute_gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    loss_agg: LossAgg = "token-mean",
    norm_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO loss.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs.
        advantages: Tensor[B] (per sequence) or Tensor[B, L].
        mask: bool/float Tensor[B, L] of valid tokens, or None.
        clip_eps: ε_low of the sequence-ratio clip (paper: 3e-4).
        clip_eps_high: ε_high (paper: 4e-4; None: ``clip_eps``).
        loss_agg, norm_length: how per-token losses reduce (see
            :func:`~asyncrlhf.losses.aggregate`).

    Returns:
        ``(loss, metrics)``: the token ratio statistics, ``clip_frac`` (share of valid
        tokens in clipped sequences) and ``seq_ratio_mean``/``seq_ratio_max``.

    Example:
        >>> lp = torch.zeros(2, 3)
        >>> loss, m = compute_gspo_loss(lp, lp, torch.tensor([1.0, -1.0]))
        >>> loss.item(), m["clip_frac"]
        (0.0, 0.0)
    """
    clip_eps = check_clip_eps(clip_eps)
    high = clip_eps if clip_eps_high is None else check_clip_eps(clip_eps_high)
    check_loss_agg(loss_agg, norm_length)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    seq_log_ratio = masked_mean(inputs.log_ratio, inputs.mask, dim=1)  # (B,), log s_i
    per_token_log_s = seq_log_ratio[:, None].expand_as(inputs.log_ratio)  # (B, L)
    objective, clipped = clipped_surrogate(per_token_log_s, inputs.advantages, 1.0 - clip_eps, 1.0 + high)
    loss = aggregate(-objective, inputs.mask, loss_agg, norm_length)
    metrics = ratio_metrics(inputs)
    with torch.no_grad():
        has_tokens = inputs.mask.sum(dim=1) > 0
        seq_ratio = torch.exp(seq_log_ratio[has_tokens])
        metrics["clip_frac"] = masked_mean(clipped.to(inputs.mask.dtype), inputs.mask)
        metrics["seq_ratio_mean"] = seq_ratio.mean() if seq_ratio.numel() else torch.ones(())
        metrics["seq_ratio_max"] = seq_ratio.max() if seq_ratio.numel() else torch.ones(())
    return loss, to_floats(metrics)
