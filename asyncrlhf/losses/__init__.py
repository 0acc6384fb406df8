"""Policy losses for stale, asynchronous data: PPO, decoupled PPO, M2PO, GRPO and GSPO.

Each loss returns ``(loss, metrics)``: a scalar tensor carrying the gradient and a dict
of floats (clip fraction, ratio mean/max, M2, masked fraction, approximate KL…).
"""

from asyncrlhf.losses._common import LossAgg, aggregate, aggregation_share
from asyncrlhf.losses.decoupled import compute_decoupled_ppo_loss
from asyncrlhf.losses.grpo import compute_grpo_loss, group_advantages
from asyncrlhf.losses.gspo import compute_gspo_loss
from asyncrlhf.losses.m2po import compute_m2po_loss, m2po_mask, trust_region_cap
from asyncrlhf.losses.ppo import compute_ppo_loss
from asyncrlhf.losses.registry import (
    BoundLoss,
    PolicyLoss,
    get_policy_loss,
    policy_loss,
    policy_losses,
    register_policy_loss,
)

__all__ = [
    "BoundLoss",
    "LossAgg",
    "PolicyLoss",
    "aggregate",
    "aggregation_share",
    "compute_decoupled_ppo_loss",
    "compute_grpo_loss",
    "compute_gspo_loss",
    "compute_m2po_loss",
    "compute_ppo_loss",
    "get_policy_loss",
    "group_advantages",
    "m2po_mask",
    "policy_loss",
    "policy_losses",
    "register_policy_loss",
    "trust_region_cap",
]
