"""Advantage estimators: a trainer batch's rewards, group by group, to one advantage per
response. Built in: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``; add one with
:func:`register_advantage`."""

from asyncrlhf.advantages import estimators as _builtin  # noqa: F401  (registers the built-ins)
from asyncrlhf.advantages.estimators import group_advantages_scalar
from asyncrlhf.advantages.registry import (
    AdvantageEstimator,
    Estimator,
    advantage_estimators,
    apply_advantages,
    get_advantage,
    register_advantage,
)

__all__ = [
    "AdvantageEstimator",
    "Estimator",
    "advantage_estimators",
    "apply_advantages",
    "get_advantage",
    "group_advantages_scalar",
    "register_advantage",
]
