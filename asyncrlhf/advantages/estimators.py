"""The built-in advantage estimators, each over one batch of reward groups.

* ``grpo``: (R − μ_g) / (σ_g + ε), the group's mean and population std (Shao et al.,
  2024, DeepSeekMath, arXiv:2402.03300, §4.1).
* ``dr_grpo``: R − μ_g, no std division (Liu et al., 2025, Dr. GRPO, arXiv:2503.20783).
* ``rloo``: R_i − mean of the group's *other* rewards, = G/(G−1)·(R_i − μ_g) (Ahmadian
  et al., 2024, "Back to Basics", arXiv:2402.14740); needs G ≥ 2.
* ``reinforce_pp``: REINFORCE++ with a baseline (Hu, 2025, arXiv:2501.03262; OpenRLHF's
  ``reinforce_baseline``): R − μ_g, then divided by the population std of those over the
  whole batch, so advantages have one scale across prompts instead of one per group.

A group (or, for ``reinforce_pp``, a batch) whose rewards are all equal gets exact zeros.
"""

from __future__ import annotations

import math

from asyncrlhf.advantages.registry import register_advantage

__all__ = ["dr_grpo", "group_advantages_scalar", "grpo", "reinforce_pp", "rloo"]


def group_advantages_scalar(rewards: list[float], eps: float = 1e-8, scale: bool = True) -> list[float]:
    """:func:`~asyncrlhf.losses.group_advantages` of one group of host floats, in float64.

    >>> group_advantages_scalar([1.0, 0.0], scale=False)
    [0.5, -0.5]
    """
    n = len(rewards)
    if n == 0:
        raise ValueError("rewards must not be empty")
    if max(rewards) == min(rewards):
        return [0.0] * n
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError(f"rewards must be finite, got {rewards!r}")
    # In units of the largest |reward| (1 for 0/1 rewards: the same arithmetic), so that
    # rewards near 1e308 neither overflow the mean and the std to inf nor, through them,
    # turn every advantage into 0: (R − μ)/(σ + eps) = (R/t − μ/t)/(σ/t + eps/t).
    top = max(abs(r) for r in rewards)
    mean = math.fsum(r / top for r in rewards) / n
    centred = [r / top - mean for r in rewards]
    if not scale:
        return [c * top for c in centred]
    std = math.sqrt(sum(c * c for c in centred) / n)  # population std
    return [c / (std + eps / top) for c in centred]


@register_advantage("grpo")
def grpo(rewards: list[list[float]]) -> list[list[float]]:
    """GRPO's group-normalised advantages.

    >>> [[round(a, 6) for a in g] for g in grpo([[1.0, 0.0], [1.0, 1.0]])]
    [[1.0, -1.0], [0.0, 0.0]]
    """
    return [group_advantages_scalar(group) for group in rewards]


@register_advantage("dr_grpo")
def dr_grpo(rewards: list[list[float]]) -> list[list[float]]:
    """Dr. GRPO: the group mean as baseline, no std division.

    >>> dr_grpo([[1.0, 0.0, 0.0, 0.0]])
    [[0.75, -0.25, -0.25, -0.25]]
    """
    return [group_advantages_scalar(group, scale=False) for group in rewards]


@register_advantage("rloo", min_group_size=2)
def rloo(rewards: list[list[float]]) -> list[list[float]]:
    """REINFORCE leave-one-out: each response's baseline is the mean of the others'.

    >>> rloo([[1.0, 0.0, 0.0, 0.0]])
    [[1.0, -0.3333333333333333, -0.3333333333333333, -0.3333333333333333]]
    """
    out = []
    for group in rewards:
        if len(group) < 2:
            raise ValueError(f"rloo needs at least 2 completions per prompt, got a group of {len(group)}")
        out.append([c * len(group) / (len(group) - 1) for c in group_advantages_scalar(group, scale=False)])
    return out


@register_advantage("reinforce_pp")
def reinforce_pp(rewards: list[list[float]], eps: float = 1e-8) -> list[list[float]]:
    """REINFORCE++-baseline: group-mean baseline, normalised by the batch's std.

    >>> [[round(a, 6) for a in g] for g in reinforce_pp([[1.0, 0.0], [1.0, 1.0]])]
    [[1.414214, -1.414214], [0.0, 0.0]]
    """
    centred = [group_advantages_scalar(group, scale=False) for group in rewards]
    flat = [c for group in centred for c in group]
    std = math.sqrt(math.fsum(c * c for c in flat) / len(flat))  # their batch mean is 0
    if std == 0.0:
        return [[0.0] * len(group) for group in centred]
    return [[c / (std + eps) for c in group] for group in centred]
