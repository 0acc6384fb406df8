"""Clipped PPO surrogate (Schulman et al., 2017, "Proximal Policy Optimization
Algorithms", arXiv:1707.06347, eq. 7), per token.

    r_t = exp(log π_θ(y_t) − log π_old(y_t))
    L   = − mean_t over valid tokens of min(r_t·A_t, clip(r_t, 1 − ε, 1 + ε)·A_t)
"""

from __future__ import annotations

import torch

from asyncrlhf.losses._common import (
    LossAgg,
    aggregate,
    check_clip_eps,
    check_clip_ratio_c,
    check_loss_agg,
    clipped_surrogate,
    masked_mean,
    prepare_inputs,
    ratio_metrics,
    to_floats,
)
from asyncrlhf.losses.options import ClipOptions
from asyncrlhf.losses.registry import register_policy_loss

__all__ = ["clipped_surrogate", "compute_ppo_loss"]


@register_policy_loss("ppo", row_separable=True, options=ClipOptions)
def compute_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_agg: LossAgg = "token-mean",
    norm_length: int | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO loss, by default the masked token mean over the batch.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs.
        advantages: Tensor[B] (per sequence) or Tensor[B, L] (per token).
        mask: bool/float Tensor[B, L], True on valid tokens; None means all valid.
        clip_eps: ε of the clip range [1 − ε, 1 + ε].
        clip_eps_high: an upper ε of its own, [1 − ε, 1 + ε_high] ("clip-higher",
            DAPO, arXiv:2503.14476); None: ``clip_eps``.
        loss_agg, norm_length: how per-token losses reduce (see
            :func:`~asyncrlhf.losses.aggregate`).
        clip_ratio_c: the dual clip's bound c > 1 on the objective of tokens with A < 0
            (verl's ``clip_ratio_c``; None: off); see :func:`~asyncrlhf.losses._common.clipped_surrogate`.

    Returns:
        ``(loss, metrics)`` with metrics ``clip_frac``, ``ratio_mean``, ``ratio_max``,
        ``m2``, ``approx_kl``.

    Example:
        >>> lp = torch.zeros(1, 2)
        >>> loss, m = compute_ppo_loss(lp, lp, torch.tensor([2.0]))
        >>> loss.item(), m["clip_frac"]
        (-2.0, 0.0)
    """
    clip_eps = check_clip_eps(clip_eps)
    high = clip_eps if clip_eps_high is None else check_clip_eps(clip_eps_high)
    check_loss_agg(loss_agg, norm_length)
    dual = check_clip_ratio_c(clip_ratio_c)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    objective, clipped = clipped_surrogate(inputs.log_ratio, inputs.advantages, 1.0 - clip_eps, 1.0 + high, dual)
    loss = aggregate(-objective, inputs.mask, loss_agg, norm_length)
    metrics = ratio_metrics(inputs)
    metrics["clip_frac"] = masked_mean(clipped.to(inputs.mask.dtype), inputs.mask)
    return loss, to_floats(metrics)
