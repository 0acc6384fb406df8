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

__all__ = ["ALGORITHM_NAMES", "AlgorithmSpec", "DecoupledPPOSpec", "GRPOSpec", "GSPOSpec", "M2POSpec", "PPOSpec"]


def _loss_default(name: str, option: str) -> Any:
    """The default of ``option`` in the registered loss's own signature (its one home)."""
    from asyncrlhf.losses import get_policy_loss

    return inspect.signature(get_policy_loss(name)).parameters[option].default


LossAggName = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class _AlgorithmSpec(_Section):
    name: str = Field(description="Policy loss (a registered name).")
    scale_advantages: bool = Field(True, description="Divide group advantages by their std (False: Dr. GRPO).")
    loss_agg: LossAggName = Field(
        "token-mean",
        description="How per-token losses reduce to a scalar; token-mean for every objective by default, so they "
        "differ only in what they are meant to ('seq-mean-token-sum-norm' divides by rollout.max_new_tokens).",
    )

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
    clip_eps_high: float | None = Field(None, gt=0, lt=1, description="Clip-higher's upper ε (None: clip_eps).")
    clip_ratio_c: float | None = Field(
        None, gt=1, description="Dual clip: bound c > 1 on the objective of tokens with A < 0 (verl's clip_ratio_c)."
    )


class M2POSpec(_AlgorithmSpec):
    """M2PO: a second-moment trust region instead of a clip (arXiv 2510.01161)."""

    name: Literal["m2po"] = Field("m2po", description="Policy loss.")
    m2_threshold: float = Field(
        _loss_default("m2po", "m2_threshold"), ge=0, description="Bound τ on the mean (log r)² of kept tokens."
    )
    m2_mode: Literal["trust_region", "batch", "token"] = Field(
        _loss_default("m2po", "mode"),
        description="'trust_region': the authors' released code (an adaptive clip over trust-region tokens); "
        "'batch': the paper's Algorithm 1 (drop the largest (log r)²); 'token': the per-token variant.",
    )
    m2_clip: bool = Field(False, description="batch mode: also apply the PPO clip with clip_eps (the paper does not).")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="Clip range ε when clipping (m2_clip, or mode 'token').")
    min_clip_low: float | None = Field(
        _loss_default("m2po", "min_clip_low"),
        ge=0,
        lt=1,
        description="trust_region: clip never tighter than 1 − this (null: no floor, as the authors' runs; "
        "their code's function default is 0.3).",
    )
    min_clip_high: float | None = Field(
        _loss_default("m2po", "min_clip_high"),
        ge=0,
        description="trust_region: clip never tighter than 1 + this (null: no floor, as the authors' runs; "
        "their code's function default is 0.5).",
    )

    def loss_options(self) -> dict[str, Any]:
        clip = self.clip_eps if self.m2_clip or self.m2_mode == "token" else None
        options = self.model_dump(include={"m2_threshold", "min_clip_low", "min_clip_high", "loss_agg"})
        return {**options, "mode": self.m2_mode, "clip_eps": clip}


class GRPOSpec(_AlgorithmSpec):
    """GRPO: the clipped surrogate on group-relative advantages, optional KL to the start."""

    name: Literal["grpo"] = Field("grpo", description="Policy loss.")
    clip_eps: float = Field(_loss_default("grpo", "clip_eps"), gt=0, lt=1, description="Clip range ε.")
    kl_coef: float = Field(
        _loss_default("grpo", "kl_coef"), ge=0, description="Weight of the k3 KL to the frozen initial policy."
    )
    clip_eps_high: float | None = Field(None, gt=0, lt=1, description="Clip-higher's upper ε (None: clip_eps).")
    clip_ratio_c: float | None = Field(
        None, gt=1, description="Dual clip: bound c > 1 on the objective of tokens with A < 0 (verl's clip_ratio_c)."
    )

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


class GSPOSpec(_AlgorithmSpec):
    """GSPO: the clip on a length-normalised sequence ratio (arXiv 2507.18071)."""

    name: Literal["gspo"] = Field("gspo", description="Policy loss.")
    clip_eps: float = Field(_loss_default("gspo", "clip_eps"), gt=0, lt=1, description="ε_low of the sequence clip.")
    clip_eps_high: float | None = Field(
        _loss_default("gspo", "clip_eps_high"), gt=0, lt=1, description="ε_high of the sequence clip."
    )


class DecoupledPPOSpec(_AlgorithmSpec):
    """Decoupled PPO: the clip around the proximal policy, a behaviour weight for staleness
    (AReaL, arXiv 2505.24298)."""

    name: Literal["decoupled_ppo"] = Field("decoupled_ppo", description="Policy loss.")
    clip_eps: float = Field(_loss_default("decoupled_ppo", "clip_eps"), gt=0, lt=1, description="Clip range ε.")
    clip_eps_high: float | None = Field(None, gt=0, lt=1, description="Clip-higher's upper ε (None: clip_eps).")
    behav_cap: float | None = Field(None, gt=0, description="Cap on the behaviour weight π_prox/π_behav (None: none).")
    behav_cap_mode: Literal["truncate", "mask"] = Field(
        "truncate", description="'truncate': min(w, cap) (truncated IS); 'mask': drop tokens above the cap (AReaL)."
    )
    clip_ratio_c: float | None = Field(
        None, gt=1, description="Dual clip: bound c > 1 on the objective of tokens with A < 0 (verl's clip_ratio_c)."
    )


# One model per algorithm, chosen by `name`; adding an objective adds one model here.
AlgorithmSpec = Annotated[PPOSpec | M2POSpec | GRPOSpec | GSPOSpec | DecoupledPPOSpec, Field(discriminator="name")]
ALGORITHM_NAMES = ("grpo", "ppo", "m2po", "gspo", "decoupled_ppo")
