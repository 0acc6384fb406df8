"""GRPO: group-relative advantages and the clipped surrogate without a critic.

Shao et al., 2024, "DeepSeekMath", arXiv:2402.03300, §4.1 (outcome supervision):
    Â_i = (R_i − mean(R_group)) / std(R_group)
Liu et al., 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO), arXiv:2503.20783:
    drop the std division (``scale=False``) and the per-sequence length normalisation
    (``loss_agg="seq-mean-token-sum-norm"``).
KL to a frozen reference with Schulman's k3 estimator, exp(q − p) − (q − p) − 1 ≥ 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrlhf._checks import check_float, check_positive_int, check_rank, check_same_shape, check_tensor
from asyncrlhf.losses._common import (
    LossAgg,
    aggregate,
    bounded_log_ratio,
    check_clip_eps,
    check_clip_ratio_c,
    check_loss_agg,
    clipped_surrogate,
    masked_mean,
    prepare_inputs,
    ratio_metrics,
    to_floats,
)
from asyncrlhf.losses.options import ClipOptions, option
from asyncrlhf.losses.registry import register_policy_loss

__all__ = ["LossAgg", "aggregate", "compute_grpo_loss", "group_advantages"]


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-8, scale: bool = True) -> torch.Tensor:
    """Group-normalised advantages.

    Args:
        rewards: Tensor[N·G] laid out group after group, or Tensor[N, G].
        group_size: G, completions per prompt.
        eps: added to the population std before dividing.
        scale: divide by the std (GRPO); False gives R − μ_g (Dr. GRPO).

    Returns:
        Advantages with the shape of ``rewards``. A group whose rewards are all equal
        gets exact zeros (never NaN, never ±(rounding error)/eps).

    Example:
        >>> group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2).tolist()
        [1.0, -1.0, 0.0, 0.0]
    """
    check_tensor("rewards", rewards)
    check_rank("rewards", rewards, (1, 2))
    group_size = check_positive_int("group_size", group_size)
    if rewards.numel() % group_size != 0 or (rewards.dim() == 2 and rewards.shape[1] != group_size):
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of group_size={group_size}")
    values = rewards.float().reshape(-1, group_size)  # (N, G)
    mean = values.mean(dim=1, keepdim=True)  # (N, 1)
    centred = values - mean
    if scale:
        std = values.std(dim=1, unbiased=False, keepdim=True)  # population std, (N, 1)
        centred = centred / (std + eps)
    # Equal rewards carry no signal; rounding in the mean must not turn into one.
    constant = values.amax(dim=1, keepdim=True) == values.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred).view_as(rewards)


def _k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 KL to the reference, exp(q − p) − (q − p) − 1, 0 on padding: (B, L)."""
    check_tensor("ref_logprobs", ref_logprobs)
    check_float("ref_logprobs", ref_logprobs)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    delta = torch.where(mask > 0, bounded_log_ratio(ref_logprobs.detach() - logprobs), torch.zeros_like(logprobs))
    return torch.exp(delta) - delta - 1.0


@dataclass
class GRPOOptions(ClipOptions):
    """GRPO: the clipped surrogate on group-relative advantages, optional KL to the start."""

    kl_coef: float = option(0.0, "Weight of the k3 KL to the frozen initial policy.", ge=0)

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


@register_policy_loss("grpo", row_separable=True, options=GRPOOptions)
def compute_grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    loss_agg: LossAgg = "token-mean",
    norm_length: int | None = None,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss: clipped surrogate on per-sequence advantages, plus k3 KL.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs.
        advantages: Tensor[B] (one per sequence, e.g. from :func:`group_advantages`)
            or Tensor[B, L].
        mask: bool/float Tensor[B, L] of valid tokens, or None.
        clip_eps: ε of the clip range.
        ref_logprobs: Tensor[B, L] of a frozen reference policy, for the KL term.
        kl_coef: weight β of the KL term; used only with ``ref_logprobs``.
        loss_agg: how per-token losses reduce to a scalar (see :func:`aggregate`);
            token-mean by default, as for every objective here (the original GRPO is
            ``seq-mean-token-mean``).
        norm_length: the constant divisor of ``seq-mean-token-sum-norm``: the
            generation budget (``max_new_tokens``).
        clip_eps_high: clip-higher's own upper ε (None: ``clip_eps``).
        clip_ratio_c: the dual clip's bound c > 1 on the objective of tokens with A < 0
            (verl's ``clip_ratio_c``; None: off); see :func:`~asyncrlhf.losses._common.clipped_surrogate`.

    Returns:
        ``(loss, metrics)`` with ``clip_frac``, ratio statistics, ``m2``, ``approx_kl``
        and ``kl`` (the mean k3 KL to the reference; 0 without one).
    """
    clip_eps = check_clip_eps(clip_eps)
    high = clip_eps if clip_eps_high is None else check_clip_eps(clip_eps_high)
    check_loss_agg(loss_agg, norm_length)
    if isinstance(kl_coef, bool) or not isinstance(kl_coef, int | float) or kl_coef < 0:
        raise ValueError(f"kl_coef must be a non-negative number, got {kl_coef!r}")
    dual = check_clip_ratio_c(clip_ratio_c)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    objective, clipped = clipped_surrogate(inputs.log_ratio, inputs.advantages, 1.0 - clip_eps, 1.0 + high, dual)
    per_token = -objective  # (B, L)

    kl = torch.zeros((), device=logprobs.device, dtype=logprobs.dtype)
    if ref_logprobs is not None:
        kl_per_token = _k3_kl(logprobs, ref_logprobs, inputs.mask)
        kl = masked_mean(kl_per_token.detach(), inputs.mask)
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl_per_token

    loss = aggregate(per_token, inputs.mask, loss_agg, norm_length)
    metrics = ratio_metrics(inputs)
    metrics["clip_frac"] = masked_mean(clipped.to(inputs.mask.dtype), inputs.mask)
    metrics["kl"] = kl
    return loss, to_floats(metrics)
