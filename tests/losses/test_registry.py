"""The policy-loss registry: one decorator, options checked against the loss's signature."""

from __future__ import annotations

import pytest
import torch

from asyncrlhf.losses import compute_grpo_loss, compute_ppo_loss, policy_loss, policy_losses, register_policy_loss
from asyncrlhf.losses.registry import _REGISTRY


def test_the_builtin_losses_are_registered_and_bound_losses_keep_the_function():
    assert {"ppo", "m2po", "grpo"} <= set(policy_losses())
    bound = policy_loss("ppo", clip_eps=0.1)
    assert bound.fn is compute_ppo_loss and bound.options == {"clip_eps": 0.1}
    assert not bound.uses_reference and policy_loss("grpo").uses_reference


def test_a_bound_loss_equals_calling_the_function_and_passes_the_reference_only_where_taken():
    torch.manual_seed(0)
    logprobs, old = torch.randn(4, 6) * 0.1, torch.randn(4, 6) * 0.1
    advantages, ref = torch.randn(4), torch.randn(4, 6) * 0.1
    got, _ = policy_loss("grpo", kl_coef=0.1)(logprobs, old, advantages, None, ref)
    want, _ = compute_grpo_loss(logprobs, old, advantages, None, ref_logprobs=ref, kl_coef=0.1)
    assert torch.equal(got, want)
    got, _ = policy_loss("ppo")(logprobs, old, advantages, None, ref)  # PPO has no reference: not passed
    assert torch.equal(got, compute_ppo_loss(logprobs, old, advantages)[0])


def test_unknown_options_and_names_fail_when_bound_naming_them():
    with pytest.raises(ValueError, match=r"unknown options \['m2_threshold'\] for policy loss 'ppo': allowed"):
        policy_loss("ppo", m2_threshold=0.1)
    with pytest.raises(ValueError, match="inputs of the loss"):
        policy_loss("grpo", ref_logprobs=None)
    with pytest.raises(ValueError, match=r"unknown algorithm.*'dpo'"):
        policy_loss("dpo")


def test_a_new_objective_is_one_decorated_function():
    @register_policy_loss("mean_ratio")
    def mean_ratio(logprobs, old_logprobs, advantages, mask=None, scale=1.0):  # type: ignore[no-untyped-def]
        ratio = (logprobs - old_logprobs).exp()
        return -(scale * ratio * advantages[:, None]).mean(), {"scale": scale}

    try:
        loss, metrics = policy_loss("mean_ratio", scale=2.0)(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2))
        assert loss.item() == -2.0 and metrics == {"scale": 2.0}
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("mean_ratio")(compute_ppo_loss)
        with pytest.raises(TypeError, match="must start with"):
            register_policy_loss("bad")(lambda advantages, logprobs: None)
    finally:
        _REGISTRY.pop("mean_ratio", None)
