"""M2PO: second-moment trust policy optimisation for stale data.

Zheng et al., 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with
Stale Data on LLMs?", arXiv:2510.01161, Algorithm 1.

Staleness shows up as importance ratios far from 1. Instead of clipping each ratio
(which silences exactly the informative high-entropy tokens), M2PO bounds the batch's
second moment of the log-ratio, M2 = mean (log r)², by masking the fewest extreme
tokens: drop the token with the largest (log r)² until the mean over the kept tokens
is ≤ τ_M2, then optimise the unclipped r·A over the kept tokens.

Three rules, chosen by ``mode``:

- ``"trust_region"``: the authors' released code (Infini-AI-Lab/M2PO, a verl fork:
  ``_get_trust_region_tokens_delta_sq``, ``kpo_clip_harmful_tokens`` and
  ``compute_m2po_policy_loss`` in ``verl/trainer/ppo/core_algos.py``). Only the
  trust-region tokens count, those a PPO clip could bind: A > 0 with r > 1, or A < 0
  with r < 1. If their mean (log r)² exceeds the budget τ, a cap τ* on |log r| is solved
  so that the capped mean meets it, and applied as an adaptive PPO clip
  [e^−τ*, e^τ*]; within budget nothing is clipped. Token-mean over all valid tokens.
  This is the authors' run path: their ``compute_m2po_policy_loss`` has ``miniclip``
  floors (0.3, 0.5) as function defaults, but their actor passes
  ``config.get("miniclip_low", None)`` and no training script sets them, so the runs
  behind the paper had none. ``min_clip_low``/``min_clip_high`` give the floors back.
- ``"batch"``: the paper's Algorithm 1 as written (and AReaL's): drop the valid tokens
  with the largest (log r)², whatever the advantage's sign, until the mean over the kept
  ones is ≤ τ; optimise the unclipped r·A over the kept tokens.
- ``"token"``: the simpler per-token variant this project's seed described: keep tokens
  with r² < threshold and apply the PPO clip on top.

A dropped or clipped token's ratio is never formed (its log-ratio is zeroed before
``exp``), and every log-ratio is bounded (±20) first, so any finite current log-probs and
any behaviour log-probs, −inf included, give a finite loss and gradient in every mode.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

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

__all__ = ["compute_m2po_loss", "m2po_mask", "trust_region_cap"]

_EPS = 1e-12  # the authors' tolerance, throughout


def _check_threshold(m2_threshold: float) -> float:
    if isinstance(m2_threshold, bool) or not isinstance(m2_threshold, int | float) or not m2_threshold >= 0:
        raise ValueError(f"m2_threshold must be a non-negative number, got {m2_threshold!r}")
    return float(m2_threshold)


@torch.no_grad()
def m2po_mask(log_ratio: torch.Tensor, mask: torch.Tensor | None, m2_threshold: float) -> torch.Tensor:
    """The M2PO batch rule: which valid tokens to keep.

    Greedily dropping the largest d = (log r)² until mean(d over kept) ≤ τ keeps the
    N − k smallest values for the smallest k that satisfies the bound. Removing the
    largest remaining value never raises the mean, so the condition is monotone in k.
    Only the largest values are ever dropped, so they are found with ``topk`` over a
    window that grows (×4) until the bound is met inside it, instead of a full sort:
    the usual stale batch drops a few percent of its tokens. On CUDA one full sort runs
    instead, with no host sync (each growth of the window reads counts on the host).
    Ties at the last dropped value are broken as the greedy loop over a stable
    descending order breaks them (lowest index first).

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
    # float64 keeps the comparison with τ exact enough to match the greedy loop. Invalid
    # tokens count 0, and the greedy loop stops before it reaches any zero: once every
    # positive value is dropped the kept mean is 0 ≤ τ.
    d = log_ratio.detach().double().square().masked_fill_(~valid, 0.0).flatten()  # (N,)
    if d.is_cuda:  # the window's growth reads counts on the host: a sync each; one sort has none
        return _sorted_keep(d, valid, m2_threshold)
    n_valid = int(valid.sum())
    if n_valid == 0 or float(d.sum()) <= m2_threshold * n_valid:
        return valid.clone()
    drop_count, last = _greedy_drop_count(d, n_valid, m2_threshold)
    drop = d > last
    ties = drop_count - int(drop.sum())
    if ties > 0:  # the greedy order drops equal values lowest index first
        drop[torch.nonzero(d == last).squeeze(1)[:ties]] = True
    return valid & ~drop.view_as(log_ratio)


def _sorted_keep(d: torch.Tensor, valid: torch.Tensor, m2_threshold: float) -> torch.Tensor:
    """The batch rule by one stable descending sort and suffix sums, with no host sync:
    what a GPU prefers (a sort of a few million values is cheap there; each sync is not).
    ``d`` (N,) is the squared log-ratio, 0 on invalid tokens; returns ``m2po_mask``'s mask."""
    flat = valid.flatten()
    order = torch.argsort(d.masked_fill(~flat, -1.0), descending=True, stable=True)  # (N,) invalid last
    d_sorted = d[order]  # (N,)
    kept_sum = torch.flip(torch.cumsum(torch.flip(d_sorted, (0,)), 0), (0,))  # after dropping the j largest
    j = torch.arange(d.numel(), device=d.device)
    kept_count = (flat.sum() - j).clamp_min(0)
    satisfied = (kept_sum <= m2_threshold * kept_count) | (kept_count == 0)
    satisfied = torch.cat([satisfied, satisfied.new_ones(1)])  # (N + 1,) dropping every token always fits
    keep_sorted = j >= torch.argmax(satisfied.to(torch.uint8))  # the first j that fits: drop the j largest
    return torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted).view_as(valid) & valid


def _greedy_drop_count(d: torch.Tensor, n_valid: int, m2_threshold: float) -> tuple[int, float]:
    """(k, d of the k-th largest): the fewest largest values whose removal brings the mean
    of the remaining valid ``d`` within ``m2_threshold``; needs k ≥ 1."""
    window = min(d.numel(), max(1024, d.numel() // 64))
    while True:
        top, index = torch.topk(d, window)  # descending
        # What remains after dropping the j largest, j = 0..window, summed without
        # subtracting from a total (which cancels when one huge ratio sits beside tiny
        # ones): the sum outside the window plus the window's suffix sums.
        outside = d.index_fill(0, index, 0.0).sum()
        suffix = torch.flip(torch.cumsum(torch.flip(top, (0,)), 0), (0,))
        kept_sum = torch.cat([suffix, suffix.new_zeros(1)]) + outside
        kept_count = (n_valid - torch.arange(window + 1, device=d.device)).clamp_min(0)
        satisfied = (kept_sum <= m2_threshold * kept_count) | (kept_count == 0)
        if bool(satisfied.any()):
            k = int(torch.argmax(satisfied.to(torch.uint8)))
            return (k, float(top[k - 1])) if k > 0 else (0, math.inf)  # 0: met at the rounding edge
        window = min(d.numel(), window * 4)


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
    with torch.no_grad():  # r² < threshold, decided on the log-ratio: log r < ½ ln threshold
        bound = 0.5 * math.log(m2_threshold) if m2_threshold > 0 else -math.inf
        return valid & (inputs.log_ratio < bound)


@torch.no_grad()
def trust_region_cap(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, budget: float
) -> tuple[float, float, float]:
    """The authors' cap on |log r| over trust-region tokens (A > 0, r > 1 or A < 0, r < 1).

    With v the ascending (log r)² of those n tokens and S = budget·n, the released code
    walks the breakpoints for the first k with (v_k − ε)(n − k − 1) + Σ_{i≤k} v_i ≥ S − ε
    and takes τ* = √(v_{k−1} − ε) (0 when k = 0): the largest breakpoint below the exact
    cap, so slightly tighter than ``Σ min(v, τ²) = S``. Done here in one sort and one
    cumulative sum instead of a Python loop.

    Returns:
        ``(tau, m2, m2_after)``: the cap (``inf`` when the budget is met: no clip), the
        trust-region tokens' mean (log r)² before and after capping.
    """
    valid = mask > 0
    harmful = valid & (((advantages > _EPS) & (log_ratio > _EPS)) | ((advantages < -_EPS) & (log_ratio < -_EPS)))
    v = log_ratio.detach()[harmful].square().double()  # (n,): squared in the input's precision, as theirs
    n = v.numel()
    if n == 0:
        return math.inf, 0.0, 0.0
    total = float(v.sum())
    m2 = total / n
    if m2 <= budget + _EPS:
        return math.inf, m2, m2
    target = budget * n
    if target <= _EPS:
        return 0.0, m2, 0.0
    v, _ = torch.sort(v)
    csum = torch.cumsum(v, 0)
    rest = torch.arange(n - 1, -1, -1, device=v.device, dtype=v.dtype)  # n − k − 1
    spread = torch.where(rest > 0, (v - _EPS) * rest, torch.zeros_like(v))  # no inf·0 for an infinite last value
    reached = spread + csum >= target - _EPS
    if not bool(reached.any()):
        return math.inf, m2, m2
    k = int(torch.argmax(reached.to(torch.uint8)))
    if k == 0:
        return 0.0, m2, total / n
    cap2 = float(v[k - 1])
    m2_after = (cap2 * (n - k) + float(csum[k - 1])) / n
    return math.sqrt(max(cap2 - _EPS, 0.0)), m2, m2_after


def _trust_region(
    inputs: Any, m2_threshold: float, min_clip_low: float | None, min_clip_high: float | None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token objective and clip flags of ``mode="trust_region"``, and its metrics."""
    tau, m2, m2_after = trust_region_cap(inputs.log_ratio, inputs.advantages, inputs.mask, m2_threshold)
    if math.isinf(tau):
        low, high = 0.0, math.inf  # within budget: no clip
    else:
        # Their code maps τ to the bounds in float32 (``torch.exp(torch.tensor(τ))``): a
        # bound is then exactly a float32 ratio, and the token at the cap (r == bound)
        # keeps its gradient, torch.clamp being inclusive. The same mapping here puts the
        # boundary where theirs falls in float32 and in float64 alike.
        e_low, e_high = (float(torch.exp(torch.tensor(x, dtype=torch.float32))) for x in (-tau, tau))
        low = 1.0 - max(1.0 - e_low, min_clip_low or 0.0)
        high = 1.0 + max(e_high - 1.0, min_clip_high or 0.0)
    objective, clipped = _clamped_surrogate(inputs, low, high)
    device, dtype = inputs.mask.device, inputs.mask.dtype
    stats = {
        "m2_trust_region": m2,
        "m2_kept": m2_after,
        "tau": tau if math.isfinite(tau) else -1.0,
        "clip_low": low,
        "clip_high": high if math.isfinite(high) else -1.0,
    }
    return objective, clipped, {k: torch.tensor(v, device=device, dtype=dtype) for k, v in stats.items()}


def _clamped_surrogate(inputs: Any, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``min(r·A, clamp(r, low, high)·A)`` with the clip decided on the ratio itself, as
    the authors' ``torch.clamp`` decides it (a token at a bound is not clipped); the
    log-ratio is bounded (±20), so the ratio is finite. A clipped token's ratio is not
    formed for the objective: it gets ``bound·A`` and no gradient."""
    advantages = inputs.advantages
    with torch.no_grad():
        clipped = ((advantages > 0) & (inputs.ratio > high)) | ((advantages < 0) & (inputs.ratio < low))
    ratio = torch.exp(torch.where(clipped, torch.zeros_like(inputs.log_ratio), inputs.log_ratio))
    bound = torch.where(advantages > 0, torch.full_like(ratio, high), torch.full_like(ratio, low))
    return torch.where(clipped, bound * advantages, ratio * advantages), clipped


@dataclass
class M2POOptions(LossOptions):
    """M2PO: a second-moment trust region instead of a clip (arXiv 2510.01161)."""

    m2_threshold: float = option(0.04, "Bound τ on the mean (log r)² of kept tokens.", ge=0)
    m2_mode: Literal["trust_region", "batch", "token"] = option(
        "batch",
        "'trust_region': the authors' released code (an adaptive clip over trust-region tokens); "
        "'batch': the paper's Algorithm 1 (drop the largest (log r)²); 'token': the per-token variant.",
    )
    m2_clip: bool = option(False, "batch mode: also apply the PPO clip with clip_eps (the paper does not).")
    clip_eps: float = option(0.2, "Clip range ε when clipping (m2_clip, or mode 'token').", gt=0, lt=1)
    min_clip_low: float | None = option(
        None,
        "trust_region: clip never tighter than 1 − this (null: no floor, as the authors' runs; their code's "
        "function default is 0.3).",
        ge=0,
        lt=1,
    )
    min_clip_high: float | None = option(
        None,
        "trust_region: clip never tighter than 1 + this (null: no floor, as the authors' runs; their code's "
        "function default is 0.5).",
        ge=0,
    )

    def loss_options(self) -> dict[str, Any]:
        clip = self.clip_eps if self.m2_clip or self.m2_mode == "token" else None
        return {
            "m2_threshold": self.m2_threshold,
            "mode": self.m2_mode,
            "clip_eps": clip,
            "min_clip_low": self.min_clip_low,
            "min_clip_high": self.min_clip_high,
            "loss_agg": self.loss_agg,
        }


@register_policy_loss("m2po", options=M2POOptions)
def compute_m2po_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    m2_threshold: float = 0.04,
    mode: Literal["trust_region", "batch", "token"] = "batch",
    clip_eps: float | None = None,
    min_clip_low: float | None = None,
    min_clip_high: float | None = None,
    loss_agg: LossAgg = "token-mean",
    norm_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """M2PO loss.

    Args:
        logprobs: Tensor[B, L], current policy log-probs (carries the gradient).
        old_logprobs: Tensor[B, L], behaviour policy log-probs.
        advantages: Tensor[B] or Tensor[B, L].
        mask: bool/float Tensor[B, L] of valid tokens, or None.
        m2_threshold: ``trust_region`` and ``batch``: the budget τ on mean (log r)²
            (paper: 0.04). ``token``: bound on r² per token; must exceed 1 or every
            on-policy token (r = 1) is masked.
        mode: ``"trust_region"`` (the authors' code), ``"batch"`` (the paper's
            Algorithm 1) or ``"token"`` (the seed's variant); see the module docstring.
        clip_eps: ``batch``/``token``: optional PPO clip on top (``token`` defaults it
            to 0.2). ``trust_region`` sets its own clip.
        min_clip_low, min_clip_high: ``trust_region``: the clip is never tighter than
            [1 − min_clip_low, 1 + min_clip_high] (the ``miniclip`` floors: 0.3 and 0.5
            are the function defaults in the authors' code, which their runs did not
            use); None: no floor, as the authors ran it.
        loss_agg, norm_length: how per-token losses reduce (see
            :func:`~asyncrlhf.losses.aggregate`); over all valid tokens, dropped ones
            counting zero (``token`` mode: over the kept tokens).

    Returns:
        ``(loss, metrics)``; metrics add ``masked_frac`` (share of valid tokens dropped),
        ``m2_kept`` (mean (log r)² of what is optimised: the kept tokens, or the capped
        trust-region tokens) and ``clip_frac``; ``trust_region`` adds
        ``m2_trust_region``, ``tau`` and the ratio bounds ``clip_low``/``clip_high``
        (−1: unbounded).
    """
    m2_threshold = _check_threshold(m2_threshold)
    _check_options(mode, loss_agg, norm_length, min_clip_low, min_clip_high)
    inputs = prepare_inputs(logprobs, old_logprobs, advantages, mask)
    metrics = ratio_metrics(inputs)
    if mode == "trust_region":
        objective, clipped, extra = _trust_region(inputs, m2_threshold, min_clip_low, min_clip_high)
        loss = aggregate(-objective, inputs.mask, loss_agg, norm_length)
        metrics.update(extra)
        metrics["masked_frac"] = torch.zeros((), device=inputs.mask.device)
        metrics["clip_frac"] = masked_mean(clipped.to(inputs.mask.dtype), inputs.mask)
    else:
        if mode == "token" and clip_eps is None:
            clip_eps = 0.2
        loss = _masked(inputs, mode, m2_threshold, clip_eps, loss_agg, norm_length, metrics)
    return loss, to_floats(metrics)


def _check_options(
    mode: str, loss_agg: str, norm_length: int | None, min_clip_low: float | None, min_clip_high: float | None
) -> None:
    if mode not in ("trust_region", "batch", "token"):
        raise ValueError(f"mode must be 'trust_region', 'batch' or 'token', got {mode!r}")
    check_loss_agg(loss_agg, norm_length)
    for name, value, top in (("min_clip_low", min_clip_low, 1.0), ("min_clip_high", min_clip_high, math.inf)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < top:
            raise ValueError(f"{name} must be a number in [0, {top:g}) or None, got {value!r}")


def _masked(
    inputs: Any,
    mode: str,
    m2_threshold: float,
    clip_eps: float | None,
    loss_agg: LossAgg,
    norm_length: int | None,
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The loss of the ``batch`` and ``token`` rules (their metrics added to ``metrics``)."""
    if clip_eps is not None:
        clip_eps = check_clip_eps(clip_eps)
    keep = _kept(inputs, mode, m2_threshold)
    keep_f = keep.to(inputs.mask.dtype)
    # A dropped token's ratio is never formed: an overflowing one cannot turn 0·inf into NaN.
    log_ratio = torch.where(keep, inputs.log_ratio, torch.zeros_like(inputs.log_ratio))
    if clip_eps is None:
        objective = torch.exp(log_ratio) * inputs.advantages  # (B, L), unclipped as in the paper
        clipped = torch.zeros_like(keep)
    else:
        objective, clipped = clipped_surrogate(log_ratio, inputs.advantages, 1.0 - clip_eps, 1.0 + clip_eps)
    # The paper normalises by all valid tokens, so masking shrinks the step; the token
    # variant renormalises over the kept tokens (its mask zeroes the dropped ones).
    if mode == "batch":
        loss = aggregate(-torch.where(keep, objective, torch.zeros_like(objective)), inputs.mask, loss_agg, norm_length)
    else:
        loss = aggregate(-objective, keep_f, loss_agg, norm_length)
    with torch.no_grad():
        metrics["masked_frac"] = (inputs.mask.sum() - keep_f.sum()) / inputs.mask.sum().clamp_min(1.0)
        metrics["m2_kept"] = masked_mean(log_ratio.square(), keep_f)
        metrics["clip_frac"] = masked_mean(clipped.to(keep_f.dtype), keep_f)
    return loss
