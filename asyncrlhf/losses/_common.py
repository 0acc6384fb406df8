"""Input checks and statistics shared by the policy losses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from asyncrlhf._checks import check_float, check_rank, check_same_shape, check_tensor

__all__ = [
    "LOG_RATIO_BOUND",
    "LOSS_AGGS",
    "LossAgg",
    "PolicyInputs",
    "aggregate",
    "aggregation_share",
    "bounded_log_ratio",
    "check_clip_eps",
    "check_clip_ratio_c",
    "check_loss_agg",
    "clipped_surrogate",
    "masked_mean",
    "prepare_inputs",
    "ratio_metrics",
    "to_floats",
]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGS = get_args(LossAgg)
# |log r| is bounded before exp() (as verl's compute_policy_loss bounds it): e^20 ≈ 5e8 is
# far beyond any ratio a real batch trains on, so nothing changes there, while a runaway
# token (behaviour log-prob −inf, a log-ratio of 100) gives a finite loss and gradient in
# every objective. A bounded token carries no gradient through its ratio.
LOG_RATIO_BOUND = 20.0


def bounded_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` clamped to ±:data:`LOG_RATIO_BOUND` (NaN-free for ±inf inputs)."""
    return torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@dataclass(slots=True)
class PolicyInputs:
    """Validated loss inputs, all (B, L) and on ``logprobs``' device."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor  # broadcast to (B, L)
    mask: torch.Tensor  # float 0/1
    log_ratio: torch.Tensor  # logprobs - old_logprobs, 0 on masked tokens
    ratio: torch.Tensor


def prepare_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
) -> PolicyInputs:
    """Validate shapes and dtypes, broadcast advantages, and form the ratio."""
    for name, value in (("logprobs", logprobs), ("old_logprobs", old_logprobs), ("advantages", advantages)):
        check_tensor(name, value)
        check_float(name, value)
    check_rank("logprobs", logprobs, 2)
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    check_rank("advantages", advantages, (1, 2))
    if advantages.dim() == 1:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)}: expected ({logprobs.shape[0]},) "
                f"or {tuple(logprobs.shape)} to match logprobs"
            )
        advantages = advantages[:, None]  # (B, 1)
    else:
        check_same_shape("advantages", advantages, "logprobs", logprobs)
    advantages = advantages.to(logprobs.dtype).expand_as(logprobs)  # (B, L)
    if mask is None:
        mask_f = torch.ones_like(logprobs)
    else:
        check_tensor("mask", mask)
        check_same_shape("mask", mask, "logprobs", logprobs)
        mask_f = mask.to(logprobs.dtype)
    old = old_logprobs.detach()
    # Zero the log-ratio on padding so garbage there can neither overflow exp() nor
    # reach the gradient through 0 * inf = NaN; bound it on valid tokens.
    log_ratio = torch.where(mask_f > 0, bounded_log_ratio(logprobs - old), torch.zeros_like(logprobs))
    return PolicyInputs(logprobs, old, advantages, mask_f, log_ratio, torch.exp(log_ratio))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (float 0/1); 0 where the mask is empty."""
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


@torch.no_grad()
def ratio_metrics(inputs: PolicyInputs) -> dict[str, torch.Tensor]:
    """Ratio statistics over valid tokens, as 0-d tensors (no host sync yet)."""
    mask = inputs.mask
    valid = mask > 0
    ratio = inputs.ratio
    log_ratio = inputs.log_ratio
    ninf = torch.tensor(float("-inf"), device=ratio.device, dtype=ratio.dtype)
    return {
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": torch.where(valid, ratio, ninf).amax() if ratio.numel() else ninf,
        # M2: the second moment of the log-ratio (M2PO's trust-region statistic).
        "m2": masked_mean(log_ratio.square(), mask),
        # k3 estimator of KL(behaviour || current): r - 1 - log r >= 0.
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
    }


def to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Move all metric tensors to the host in one transfer (one sync, not one per key)."""
    if not metrics:
        return {}
    values = torch.stack([v.detach().float().reshape(()) for v in metrics.values()]).tolist()
    return dict(zip(metrics.keys(), values, strict=True))


def check_clip_eps(clip_eps: float) -> float:
    """Validate the PPO clip range ε ∈ (0, 1)."""
    if isinstance(clip_eps, bool) or not isinstance(clip_eps, int | float) or not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps!r}")
    return float(clip_eps)


def check_clip_ratio_c(clip_ratio_c: float | None) -> float | None:
    """Validate the dual clip's bound c > 1 (None: no dual clip)."""
    if clip_ratio_c is None:
        return None
    if isinstance(clip_ratio_c, bool) or not isinstance(clip_ratio_c, int | float) or not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be a number > 1 (or None), got {clip_ratio_c!r}")
    return float(clip_ratio_c)


def check_loss_agg(loss_agg: str, norm_length: int | None) -> None:
    """A known aggregation; ``seq-mean-token-sum-norm`` needs its constant ``norm_length``."""
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if loss_agg == "seq-mean-token-sum-norm" and (
        isinstance(norm_length, bool) or not isinstance(norm_length, int) or norm_length < 1
    ):
        raise ValueError(
            "loss_agg='seq-mean-token-sum-norm' divides by a constant: give norm_length, the generation budget "
            f"(max_new_tokens), a positive integer; got {norm_length!r}"
        )


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg = "token-mean", norm_length: int | None = None
) -> torch.Tensor:
    """Reduce a (B, L) per-token loss to a scalar.

    ``token-mean``: every valid token weighs the same across the batch (verl's default,
    and M2PO's).
    ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (the
    original GRPO).
    ``seq-mean-token-sum-norm``: mean over sequences of token sums divided by the
    constant ``norm_length``, the generation budget (Dr. GRPO: no length bias). A
    constant, not the batch's padded width, so padding never changes the loss.

    Example:
        >>> per_token, mask = torch.ones(2, 4), torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]])
        >>> aggregate(per_token, mask, "seq-mean-token-sum-norm", norm_length=8).item()
        0.375
    """
    check_loss_agg(loss_agg, norm_length)
    if loss_agg == "token-mean":
        return masked_mean(per_token, mask)
    if loss_agg == "seq-mean-token-mean":
        has_tokens = (mask.sum(dim=1) > 0).to(mask.dtype)  # (B,)
        per_seq = masked_mean(per_token, mask, dim=1)  # (B,)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    per_seq = (per_token * mask).sum(dim=1) / float(norm_length)  # (B,)
    return per_seq.mean() if per_seq.numel() else per_seq.sum()


def aggregation_share(mask: torch.Tensor, rows: torch.Tensor, loss_agg: str) -> float:
    """The weight of ``rows`` in :func:`aggregate` over the whole (B, L) ``mask``.

    When the other rows' per-token losses are 0, ``aggregate`` over the whole batch
    equals this share times ``aggregate`` over ``rows`` alone: the share of valid tokens
    (``token-mean``), of sequences with a token (``seq-mean-token-mean``) or of rows
    (``seq-mean-token-sum-norm``).

    Example:
        >>> mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [0, 0, 0]])
        >>> [aggregation_share(mask, torch.tensor([1]), agg) for agg in LOSS_AGGS]
        [0.6, 0.5, 0.3333333333333333]
    """
    check_loss_agg(loss_agg, 1)
    if loss_agg == "seq-mean-token-sum-norm":
        return rows.numel() / max(mask.shape[0], 1)
    weights = mask if loss_agg == "token-mean" else (mask.sum(dim=1) > 0).to(mask.dtype)  # tokens, or sequences
    return float(weights[rows].sum()) / max(float(weights.sum()), 1.0)


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float, clip_ratio_c: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``min(r·A, clip(r, low, high)·A)`` and where a clip binds.

    The bound is decided on the log-ratio, and a token whose clip binds gets the
    constant ``bound·A`` without ever forming its ratio: a ratio that overflows
    (``old_logprobs = -inf``, a log-ratio of 100) then gives a finite loss and gradient
    instead of ``0·inf = NaN``. ``low < 1 < high``; ``high = inf`` leaves the upper side
    unclipped.

    ``clip_ratio_c`` (> 1) is the dual clip (Ye et al., 2020, arXiv:1912.09729; verl's
    ``clip_ratio_c``): where A < 0 the PPO clip leaves r unbounded above, so a token the
    policy now makes far likelier than the behaviour policy did can dominate the batch;
    the dual clip bounds its objective below by ``c·A`` (no gradient there).

    Returns:
        ``(objective, clipped)``, both (B, L); ``clipped`` is True where a clip lowered
        (or, the dual clip, raised) the objective: the token gives no gradient.
    """
    up = (advantages > 0) & (log_ratio > math.log(high))
    down = (advantages < 0) & (log_ratio < (math.log(low) if low > 0 else -math.inf))
    dual = torch.zeros_like(up) if clip_ratio_c is None else (advantages < 0) & (log_ratio > math.log(clip_ratio_c))
    clipped = up | down | dual
    ratio = torch.exp(torch.where(clipped, torch.zeros_like(log_ratio), log_ratio))
    bound = torch.where(advantages > 0, torch.full_like(ratio, high), torch.full_like(ratio, low))
    if clip_ratio_c is not None:
        bound = torch.where(dual, torch.full_like(ratio, clip_ratio_c), bound)
    objective = torch.where(clipped, bound * advantages, ratio * advantages)
    return objective, clipped
