"""M2PO: second-moment trust policy optimisation for stale data.

Zheng et al., 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with
Stale Data on LLMs?", arXiv:2510.01161, Algorithm 1.

Staleness shows up as importance ratios far from 1. Instead of clipping each ratio
(which silences exactly the informative high-entropy tokens), M2PO bounds the batch's
second moment of the log-ratio, M2 = mean (log r)², by masking the fewest extreme
tokens: drop the token with the largest (log r)² until the mean over the kept tokens
is ≤ τ_M2, then optimise the unclipped r·A over the kept tokens.

``mode="token"`` is the simpler per-token variant this project's seed described: keep
tokens with r² < threshold and apply the PPO clip on top.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch

from asyncrlhf.losses._common import check_clip_eps, masked_mean, prepare_inputs, ratio_metrics, to_floats
from asyncrlhf.losses.ppo import clipped_surrogate
from asyncrlhf.losses.registry import register_policy_loss

__all__ = ["compute_m2po_loss", "m2po_mask"]


def _check_threshold(m2_threshold: float) -> float:
    if isinstance(m2_threshold, bool) or not isinstance(m2_threshold, int | float) or not m2_threshold >= 0:
        raise ValueError(f"m2_threshold must be a non-negative number, got {m2_threshold!r}")
    return float(m2_threshold)


@torch.no_grad()
def m2po_mask(log_ratio: torch.Tensor, mask: torch.Tensor | None, m2_threshold: float) -> torch.Tensor:
    """The M2PO batch rule: which valid tokens to keep.

    Greedily dropping the largest d = (log r)² until mean(d over kept) ≤ τ keeps the
    N − k smallest values for the smallest k that satisfies the bound. Removing the
    largest remaining value never raises the mean, so the condition is monotone in k
    and the whole greedy loop is one sort, one cumulative sum and one ``argmax``.

    Args:
        log_ratio: Tensor[B, L], log π_θ − log π_old.
        mask: bool/float Tensor[B, L] of valid tokens, or None (all valid).
        m2_threshold: τ_M2, the bound on the mean (log r)² of the kept tokens.

    Returns:
        BoolTensor[B, L], True on kept (valid, not masked) tokens.

    Example:
        >>> log_ratio = torch.tensor([[0.0, 0.1, 1.0]])
        >>> m2po_mask(log_ratio, None, m2_threshold=0.04).tolist()
        [[True, True, False]]
    """
    m2_threshold = _check_threshold(m2_threshold)
    valid = torch.ones_like(log_ratio, dtype=torch.bool) if mask is None else mask.bool()
    d = torch.where(valid, log_ratio.detach().double().square(), -1.0).flatten()  # (N,)
    order = torch.argsort(d, descending=True, stable=True)  # valid tokens first, largest d first
    d_sorted = d[order].clamp_min(0.0)  # invalid tokens contribute 0 at the tail
    # kept_sum[k] = sum of d_sorted[k:], what remains after dropping the k largest.
    # Summed from the smallest up (suffix sums) rather than total − prefix, which
    # cancels catastrophically when one huge ratio sits beside tiny ones. float64
    # keeps the comparison with τ exact enough to match the greedy loop.
    kept_sum = torch.flip(torch.cumsum(torch.flip(d_sorted, (0,)), 0), (0,))
    k = torch.arange(d.numel(), device=d.device)
    kept_count = (valid.sum() - k).clamp_min(0)
    # After dropping k tokens: mean = kept_sum / kept_count ≤ τ.
    satisfied = (kept_sum <= m2_threshold * kept_count) | (kept_count == 0)
    # k = N (drop everything) always satisfies the bound: append it so argmax finds it.
    satisfied = torch.cat([satisfied, satisfied.new_ones(1)])
    first_ok = torch.argmax(satisfied.to(torch.uint8))  # smallest k with the bound met
    keep_sorted = k >= first_ok  # (N,) by rank
    keep = torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted)
    return keep.view_as(log_ratio) & valid


def _kept(inputs: Any, mode: str, m2_threshold: float) -> torch.Tensor:
    """Tokens M2PO keeps: the batch rule, or r² below the threshold per token."""
    valid = inputs.mask > 0
    if mode == "batch":
        return m2po_mask(inputs.log_ratio, valid, m2_threshold)
    if m2_threshold <= 1.0:
        warnings.warn(
            f"m2po mode='token' keeps tokens with r² < m2_threshold={m2_threshold}; "
            "with a threshold ≤ 1 even on-policy tokens (r = 1) are masked",
            stacklevel=3,
        )
    with torch.no_grad():
        return valid & (inputs.ratio.square() < m2_threshold)


@register_policy_loss("m2po")
def compute_m2po_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    m2_threshold: float = 0.04,
    mode: Literal["batch", "token"] = "batch",
    clip_eps: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """M2PO loss.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs.
        advantages: Tensor[B] or Tensor[B, L].
        mask: bool/float Tensor[B, L] of valid tokens, or None.
        m2_threshold: ``batch``: τ_M2 bounding mean (log r)² of kept tokens (paper:
            0.04). ``token``: bound on r² per token; must exceed 1 or every on-policy
            token (r = 1) is masked.
        mode: ``"batch"`` (the paper's rule) or ``"token"`` (the seed's variant).
        clip_eps: optional PPO clip on top; ``token`` mode defaults it to 0.2.

    Returns:
        ``(loss, metrics)``: ``batch`` gives −Σ kept·r·A / (number of valid tokens);
        ``token`` gives −Σ kept·min(r·A, clip(r)·A) / max(1, Σ kept). Metrics add
        ``masked_frac`` (share of valid tokens dropped), ``m2_kept`` and ``clip_frac``.
    """
    m2_threshold = _check_threshold(m2_threshold)
    if mode not in ("batch", "token"):
        raise ValueError(f"mode must be 'batch' or 'token', got {mode!r}")
    if mode == "token" and clip_eps is None:
        clip_eps = 0.2
    if clip_eps is not None:
        clip_eps = check_clip_eps(clip_eps)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    keep_f = _kept(inputs, mode, m2_threshold).to(inputs.mask.dtype)

    if clip_eps is None:
        objective = inputs.ratio * inputs.advantages  # (B, L), unclipped as in the paper
        clipped = torch.zeros_like(keep_f, dtype=torch.bool)
    else:
        objective, clipped = clipped_surrogate(inputs.ratio, inputs.advantages, clip_eps)
    # The paper normalises by all valid tokens, so masking shrinks the step; the
    # token variant renormalises over the kept tokens.
    normaliser = inputs.mask.sum() if mode == "batch" else keep_f.sum()
    loss = -(objective * keep_f).sum() / normaliser.clamp_min(1.0)

    metrics = ratio_metrics(inputs)
    with torch.no_grad():
        metrics["masked_frac"] = (inputs.mask.sum() - keep_f.sum()) / inputs.mask.sum().clamp_min(1.0)
        metrics["m2_kept"] = masked_mean(inputs.log_ratio.square(), keep_f)
        metrics["clip_frac"] = masked_mean(clipped.to(keep_f.dtype), keep_f)
    return loss, to_floats(metrics)
