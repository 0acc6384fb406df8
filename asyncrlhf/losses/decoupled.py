"""Decoupled PPO: the clip measured from a proximal policy, the staleness corrected apart.

Fu et al., 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv:2505.24298, eq. 5:

    J = E[ (π_prox / π_behav) · min(r·A, clip(r, 1 − ε, 1 + ε)·A) ],   r = π_θ / π_prox

π_behav generated the data (any number of versions ago); π_prox is the trainer's policy at
the start of this step (its log-probs recomputed once, before the step's updates). The
trust region is then taken around the recent π_prox, not around the stale π_behav, and
the behaviour weight π_prox/π_behav (no gradient) corrects for the staleness. That weight
can be truncated (``behav_cap_mode="truncate"``: min(w, C), truncated importance
sampling) or tokens above the cap dropped (``"mask"``, AReaL's ``behav_imp_weight_cap``).
With π_prox = π_behav (on-policy data) it is PPO exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

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

__all__ = ["compute_decoupled_ppo_loss"]


@dataclass
class DecoupledPPOOptions(ClipOptions):
    """Decoupled PPO: the clip around the proximal policy, a behaviour weight for
    staleness (AReaL, arXiv 2505.24298)."""

    behav_cap: float | None = option(None, "Cap on the behaviour weight π_prox/π_behav (None: none).", gt=0)
    behav_cap_mode: Literal["truncate", "mask"] = option(
        "truncate", "'truncate': min(w, cap) (truncated IS); 'mask': drop tokens above the cap (AReaL)."
    )


@register_policy_loss("decoupled_ppo", row_separable=True, options=DecoupledPPOOptions)
def compute_decoupled_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    prox_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    behav_cap: float | None = None,
    behav_cap_mode: Literal["truncate", "mask"] = "truncate",
    loss_agg: LossAgg = "token-mean",
    norm_length: int | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO loss.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs (from the rollout).
        advantages: Tensor[B] or Tensor[B, L].
        mask: bool/float Tensor[B, L] of valid tokens, or None.
        prox_logprobs: Tensor[B, L], the proximal policy's log-probs (the trainer
            recomputes them once per step); None: the behaviour policy (PPO).
        clip_eps, clip_eps_high, clip_ratio_c: the clip range of r = π_θ/π_prox, and
            the dual clip's bound c > 1 where A < 0 (None: off; see ``compute_ppo_loss``).
        behav_cap: cap C on the behaviour weight π_prox/π_behav (None: uncapped).
        behav_cap_mode: ``"truncate"`` (min(w, C)) or ``"mask"`` (drop tokens with w > C).
        loss_agg, norm_length: how per-token losses reduce (see
            :func:`~asyncrlhf.losses.aggregate`).

    Returns:
        ``(loss, metrics)``: ratio statistics of π_θ against the behaviour policy,
        ``clip_frac`` (of the proximal clip), ``behav_weight_mean``/``behav_weight_max``,
        ``behav_capped_frac`` and ``m2_behav_prox``, the second moment of
        log(π_prox/π_behav) (M2PO's statistic between behaviour and proximal, as AReaL
        logs it).

    Example:
        >>> lp = torch.zeros(1, 2)
        >>> loss, m = compute_decoupled_ppo_loss(lp, lp, torch.tensor([2.0]), prox_logprobs=lp)
        >>> loss.item(), m["behav_weight_mean"]
        (-2.0, 1.0)
    """
    clip_eps, high, dual = _check_options(clip_eps, clip_eps_high, clip_ratio_c, behav_cap, behav_cap_mode)
    check_loss_agg(loss_agg, norm_length)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    prox = inputs.old_logprobs if prox_logprobs is None else prox_logprobs.detach()
    if prox.shape != logprobs.shape:
        raise ValueError(f"prox_logprobs has shape {tuple(prox.shape)}, logprobs {tuple(logprobs.shape)}")
    valid = inputs.mask > 0
    zeros = torch.zeros_like(logprobs)
    log_u = torch.where(valid, bounded_log_ratio(logprobs - prox), zeros)  # u = π_θ/π_prox
    objective, clipped = clipped_surrogate(log_u, inputs.advantages, 1.0 - clip_eps, 1.0 + high, dual)
    log_w = bounded_log_ratio(prox - inputs.old_logprobs)
    log_w, weight, capped = _behaviour_weight(log_w, valid, behav_cap, behav_cap_mode)
    per_token = -(weight * objective)
    loss = aggregate(per_token, inputs.mask, loss_agg, norm_length)
    metrics = _metrics(inputs, clipped, log_w, weight, capped)
    return loss, to_floats(metrics)


def _check_options(
    clip_eps: float, clip_eps_high: float | None, clip_ratio_c: float | None, behav_cap: float | None, mode: str
) -> tuple[float, float, float | None]:
    """The checked ``(ε, ε_high, dual clip c)``; the behaviour cap checked too."""
    _check_cap(behav_cap, mode)
    clip_eps = check_clip_eps(clip_eps)
    high = clip_eps if clip_eps_high is None else check_clip_eps(clip_eps_high)
    return clip_eps, high, check_clip_ratio_c(clip_ratio_c)


def _check_cap(behav_cap: float | None, behav_cap_mode: str) -> None:
    if behav_cap is not None and (
        isinstance(behav_cap, bool) or not isinstance(behav_cap, int | float) or not behav_cap > 0
    ):
        raise ValueError(f"behav_cap must be a positive number or None, got {behav_cap!r}")
    if behav_cap_mode not in ("truncate", "mask"):
        raise ValueError(f"behav_cap_mode must be 'truncate' or 'mask', got {behav_cap_mode!r}")


@torch.no_grad()
def _behaviour_weight(
    log_w: torch.Tensor, valid: torch.Tensor, cap: float | None, mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log w, w, capped)`` of π_prox/π_behav on valid tokens (0 elsewhere), capped."""
    zeros = torch.zeros_like(log_w)
    log_w = torch.where(valid, log_w, zeros)
    capped = torch.zeros_like(valid) if cap is None else valid & (log_w > math.log(cap))
    if cap is not None and mode == "truncate":
        return log_w, torch.exp(torch.clamp(log_w, max=math.log(cap))), capped
    return log_w, torch.where(capped, zeros, torch.exp(torch.where(capped, zeros, log_w))), capped


@torch.no_grad()
def _metrics(
    inputs: Any, clipped: torch.Tensor, log_w: torch.Tensor, weight: torch.Tensor, capped: torch.Tensor
) -> dict[str, torch.Tensor]:
    metrics, valid, dtype = ratio_metrics(inputs), inputs.mask > 0, inputs.mask.dtype
    ninf = torch.full_like(weight, -math.inf)
    metrics["clip_frac"] = masked_mean(clipped.to(dtype), inputs.mask)
    metrics["behav_weight_mean"] = masked_mean(weight, inputs.mask)
    metrics["behav_weight_max"] = torch.where(valid, weight, ninf).amax() if weight.numel() else ninf.sum()
    metrics["behav_capped_frac"] = masked_mean(capped.to(dtype), inputs.mask)
    metrics["m2_behav_prox"] = masked_mean(log_w.square(), inputs.mask)
    return metrics
