"""Choose a policy loss by name, with its knobs bound: what the trainer calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from asyncrlhf.losses.grpo import compute_grpo_loss
from asyncrlhf.losses.m2po import compute_m2po_loss
from asyncrlhf.losses.ppo import compute_ppo_loss

__all__ = ["ALGORITHMS", "PolicyLoss", "make_policy_loss"]

# (logprobs, old_logprobs, advantages, mask, ref_logprobs) -> (loss, metrics)
PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    tuple[torch.Tensor, dict[str, float]],
]
ALGORITHMS = ("ppo", "m2po", "grpo")


def make_policy_loss(algorithm: str, **options: Any) -> PolicyLoss:
    """Bind a loss's options once; unknown options fail here, not mid-training.

    ``ppo``: ``clip_eps``. ``m2po``: ``m2_threshold``, ``mode``, ``clip_eps``.
    ``grpo``: ``clip_eps``, ``kl_coef``, ``loss_agg`` (uses the reference log-probs).
    """
    allowed = {
        "ppo": {"clip_eps"},
        "m2po": {"m2_threshold", "mode", "clip_eps"},
        "grpo": {"clip_eps", "kl_coef", "loss_agg"},
    }
    if algorithm not in allowed:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    unknown = set(options) - allowed[algorithm]
    if unknown:
        raise ValueError(
            f"unknown options {sorted(unknown)} for algorithm {algorithm!r}: allowed {sorted(allowed[algorithm])}"
        )

    def loss(logprobs, old_logprobs, advantages, mask, ref_logprobs=None):  # type: ignore[no-untyped-def]
        if algorithm == "ppo":
            return compute_ppo_loss(logprobs, old_logprobs, advantages, mask, **options)
        if algorithm == "m2po":
            return compute_m2po_loss(logprobs, old_logprobs, advantages, mask, **options)
        return compute_grpo_loss(logprobs, old_logprobs, advantages, mask, ref_logprobs=ref_logprobs, **options)

    return loss
