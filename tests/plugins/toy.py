"""A user's extension in one file: a policy loss with its options and an advantage
estimator. Nothing else in the tree names them; a spec lists this file in ``plugins``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrlhf.advantages import register_advantage
from asyncrlhf.losses import register_policy_loss
from asyncrlhf.losses.options import LossOptions, option

CALLS = {"loss": 0, "advantage": 0}


@dataclass
class ScaledPGOptions(LossOptions):
    """Plain policy gradient, scaled."""

    scale: float = option(1.0, "Multiplies the loss.", gt=0, le=10)


@register_policy_loss("toy_scaled_pg", row_separable=True, options=ScaledPGOptions)
def scaled_pg(logprobs, old_logprobs, advantages, mask=None, scale=1.0, loss_agg="token-mean"):  # type: ignore[no-untyped-def]
    """−scale · mean(A · log π) over valid tokens."""
    CALLS["loss"] += 1
    mask = torch.ones_like(logprobs) if mask is None else mask.to(logprobs.dtype)
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logprobs)
    loss = -scale * (adv * logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"scale": float(scale)}  # reported as policy/scale


@register_advantage("toy_sign", min_group_size=3)
def sign(rewards: list[list[float]]) -> list[list[float]]:
    """+1 above the group's mean, −1 below, 0 at it (asks for groups of 3 or more, to show the check)."""
    CALLS["advantage"] += 1
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        out.append([float((r > mean) - (r < mean)) for r in group])
    return out
