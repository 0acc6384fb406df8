"""A loss's options: what an experiment spec may set, with defaults, bounds and words.

Options are plain dataclasses (the core needs no validation library); ``pipelines``
turns each registered loss's options into its spec section, enforcing the bounds given
to :func:`option` and showing their descriptions in the schema.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from asyncrlhf.losses._common import LossAgg

__all__ = ["ClipOptions", "LossOptions", "Options", "option"]


def option(
    default: Any,
    description: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A loss option: its default, what it does, and the bounds a spec checks it against."""
    bounds = {key: value for key, value in {"gt": gt, "ge": ge, "lt": lt, "le": le}.items() if value is not None}
    return dataclasses.field(default=default, metadata={"description": description, **bounds})


@dataclass
class Options:
    """A loss's options: none (a loss registered without options takes no keyword)."""

    def loss_options(self) -> dict[str, Any]:
        """The loss function's keyword arguments (by default, the fields as they are)."""
        return dataclasses.asdict(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer needs a frozen reference policy (a KL term)."""
        return False


@dataclass
class LossOptions(Options):
    """The aggregation, which every built-in loss takes; their options derive from this."""

    loss_agg: LossAgg = option(
        "token-mean",
        "How per-token losses reduce to a scalar; token-mean for every objective by default, so they "
        "differ only in what they are meant to ('seq-mean-token-sum-norm' divides by rollout.max_new_tokens).",
    )


@dataclass
class ClipOptions(LossOptions):
    """PPO's clip, with clip-higher and the dual clip (shared by the clipped objectives)."""

    clip_eps: float = option(0.2, "Clip range ε.", gt=0, lt=1)
    clip_eps_high: float | None = option(None, "Clip-higher's upper ε (None: clip_eps).", gt=0, lt=1)
    clip_ratio_c: float | None = option(
        None, "Dual clip: bound c > 1 on the objective of tokens with A < 0 (verl's clip_ratio_c).", gt=1
    )
