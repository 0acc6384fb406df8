"""The spec's ``algorithm`` section: one pydantic model per registered policy loss.

The section is a discriminated union on ``name``; each model's options default to the
loss's own signature (:func:`_loss_default`), so a default lives in one place. Adding an
objective: register its loss (:func:`asyncrlhf.losses.register_policy_loss`), add its
model here and to :data:`AlgorithmSpec`.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal

from pydantic import Field

from pipelines.specfile import _Section

__all__ = ["ALGORITHM_NAMES", "AlgorithmSpec", "GRPOSpec", "M2POSpec", "PPOSpec"]


def _loss_default(name: str, option: str) -> Any:
    """The default of ``option`` in the registered loss's own signature (its one home)."""
    from asyncrlhf.losses import get_policy_loss

    return inspect.signature(get_policy_loss(name)).parameters[option].default


class _AlgorithmSpec(_Section):
    name: str = Field(description="Policy loss (a registered name).")
    scale_advantages: bool = Field(True, description="Divide group advantages by their std (False: Dr. GRPO).")

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer needs a frozen reference policy (a KL term)."""
        return False

    def loss_options(self) -> dict[str, Any]:
        """Keyword options of the loss (its signature checks them when bound)."""
        return self.model_dump(exclude={"name", "scale_advantages"})


class PPOSpec(_AlgorithmSpec):
    """PPO's clipped surrogate, per token."""

    name: Literal["ppo"] = Field("ppo", description="Policy loss.")
    clip_eps: float = Field(_loss_default("ppo", "clip_eps"), gt=0, lt=1, description="Clip range ε.")


class M2POSpec(_AlgorithmSpec):
    """M2PO: a second-moment trust region instead of a clip (arXiv 2510.01161)."""

    name: Literal["m2po"] = Field("m2po", description="Policy loss.")
    m2_threshold: float = Field(
        _loss_default("m2po", "m2_threshold"), ge=0, description="Bound τ on the mean (log r)² of kept tokens."
    )
    m2_mode: Literal["batch", "token"] = Field(
        _loss_default("m2po", "mode"), description="The paper's batch rule, or the per-token variant."
    )
    m2_clip: bool = Field(False, description="Also apply the PPO clip with clip_eps (the paper does not).")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="Clip range ε when clipping (m2_clip, or mode 'token').")

    def loss_options(self) -> dict[str, Any]:
        clip = self.clip_eps if self.m2_clip or self.m2_mode == "token" else None
        return {"m2_threshold": self.m2_threshold, "mode": self.m2_mode, "clip_eps": clip}


class GRPOSpec(_AlgorithmSpec):
    """GRPO: the clipped surrogate on group-relative advantages, optional KL to the start."""

    name: Literal["grpo"] = Field("grpo", description="Policy loss.")
    clip_eps: float = Field(_loss_default("grpo", "clip_eps"), gt=0, lt=1, description="Clip range ε.")
    kl_coef: float = Field(
        _loss_default("grpo", "kl_coef"), ge=0, description="Weight of the k3 KL to the frozen initial policy."
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        _loss_default("grpo", "loss_agg"), description="How per-token losses reduce to a scalar."
    )

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


# One model per algorithm, chosen by `name`; adding an objective adds one model here.
AlgorithmSpec = Annotated[PPOSpec | M2POSpec | GRPOSpec, Field(discriminator="name")]
ALGORITHM_NAMES = ("grpo", "ppo", "m2po")
