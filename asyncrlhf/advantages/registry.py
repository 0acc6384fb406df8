"""The advantage-estimator registry: one decorator, one signature.

An estimator turns the rewards of one trainer batch, group by group, into one advantage
per response: ``fn(rewards: list[list[float]]) -> list[list[float]]`` with the shape of
its input (N groups of G host floats; a group is the G completions of one prompt). It
sees the whole batch, so a batch-level baseline or normalisation (REINFORCE++) is as
easy to write as a group-level one (GRPO). Rewards are host floats by then (the buffer
holds them as such), so an estimator is plain float64 arithmetic, exact and cheap.

Register one with :func:`register_advantage` and choose it by name (the spec's
``algorithm.advantage``)::

    @register_advantage("centred", min_group_size=2)
    def centred(rewards):
        return [[r - sum(g) / len(g) for r in g] for g in rewards]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "AdvantageEstimator",
    "Estimator",
    "advantage_estimators",
    "apply_advantages",
    "get_advantage",
    "register_advantage",
]

AdvantageEstimator = Callable[[list[list[float]]], list[list[float]]]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its name, function, and the smallest group it is defined for."""

    name: str
    fn: AdvantageEstimator
    min_group_size: int = 1

    def __call__(self, rewards: list[list[float]]) -> list[list[float]]:
        out = self.fn(rewards)
        if [len(g) for g in out] != [len(g) for g in rewards]:
            raise ValueError(
                f"advantage estimator {self.name!r} returned groups of {[len(g) for g in out]} "
                f"advantages for groups of {[len(g) for g in rewards]} rewards"
            )
        return out


_REGISTRY: dict[str, Estimator] = {}


def register_advantage(name: str, min_group_size: int = 1) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Register ``fn`` as the advantage estimator ``name``; returns ``fn`` unchanged.
    ``min_group_size``: the estimator needs at least this many completions per prompt
    (RLOO's leave-one-out mean needs 2); a spec with smaller groups is refused."""

    def decorate(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered ({_REGISTRY[name].fn.__qualname__})")
        _REGISTRY[name] = Estimator(name, fn, min_group_size)
        return fn

    return decorate


def advantage_estimators() -> tuple[str, ...]:
    """The registered names."""
    return tuple(sorted(_REGISTRY))


def get_advantage(name: str | Estimator) -> Estimator:
    """The estimator registered as ``name`` (an :class:`Estimator` is returned as is)."""
    if isinstance(name, Estimator):
        return name
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}: registered are {advantage_estimators()}") from None


def apply_advantages(estimator: Estimator, groups: list[list]) -> None:
    """Set each experience's ``advantage`` from its group's rewards, the batch at once."""
    advantages = estimator([[e.reward for e in group] for group in groups])
    for group, values in zip(groups, advantages, strict=True):
        for exp, value in zip(group, values, strict=True):
            exp.advantage = value
