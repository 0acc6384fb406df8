"""Policy losses for stale, asynchronous data: PPO, M2PO and GRPO.

Each loss returns ``(loss, metrics)``: a scalar tensor carrying the gradient and a dict
of floats (clip fraction, ratio mean/max, M2, masked fraction, approximate KL…).
"""

from asyncrlhf.losses.grpo import LossAgg, aggregate, compute_grpo_loss, group_advantages
from asyncrlhf.losses.m2po import compute_m2po_loss, m2po_mask
from asyncrlhf.losses.ppo import compute_ppo_loss
from asyncrlhf.losses.registry import ALGORITHMS, PolicyLoss, make_policy_loss

__all__ = [
    "ALGORITHMS",
    "LossAgg",
    "PolicyLoss",
    "aggregate",
    "compute_grpo_loss",
    "compute_m2po_loss",
    "compute_ppo_loss",
    "group_advantages",
    "m2po_mask",
    "make_policy_loss",
]
