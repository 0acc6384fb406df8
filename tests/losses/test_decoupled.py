from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.losses import compute_decoupled_ppo_loss, compute_ppo_loss, policy_loss


def batch(seed: int = 0, shape=(6, 5)):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g) * 2
    prox = old + 0.5 * torch.randn(shape, generator=g)  # the trainer moved on since the rollout
    logprobs = (prox + 0.2 * torch.randn(shape, generator=g)).requires_grad_()
    advantages = torch.randn(shape[0], generator=g)
    mask = torch.rand(shape, generator=g) > 0.2
    return logprobs, old, prox, advantages, mask


def test_with_the_behaviour_policy_as_proximal_it_is_ppo():
    logprobs, old, _, advantages, mask = batch()
    ours, _ = compute_decoupled_ppo_loss(logprobs, old, advantages, mask, prox_logprobs=old)
    ppo, _ = compute_ppo_loss(logprobs, old, advantages, mask)
    (g_ours,) = torch.autograd.grad(ours, logprobs)
    (g_ppo,) = torch.autograd.grad(ppo, logprobs)
    assert ours.item() == pytest.approx(ppo.item(), abs=1e-7) and torch.allclose(g_ours, g_ppo, atol=1e-7)


def test_hand_computed_clip_around_the_proximal_policy_and_the_behaviour_weight():
    # Token 0: π_prox/π_behav = e^0.5, r = π_θ/π_prox = e^0.1 inside [0.8, 1.2]: w·r·A.
    # Token 1: r = e^0.4 > 1.2 with A > 0: clipped at 1.2, still weighted by w = e^−0.3.
    old = torch.tensor([[-1.0, -1.0]])
    prox = torch.tensor([[-0.5, -1.3]])
    logprobs = torch.tensor([[-0.4, -0.9]])
    loss, metrics = compute_decoupled_ppo_loss(logprobs, old, torch.tensor([2.0]), prox_logprobs=prox)
    expected = -(math.exp(0.5) * math.exp(0.1) * 2 + math.exp(-0.3) * 1.2 * 2) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["clip_frac"] == 0.5 and metrics["m2_behav_prox"] == pytest.approx((0.25 + 0.09) / 2, abs=1e-6)


def test_the_behaviour_weight_is_truncated_or_masked_at_its_cap():
    old, prox, logprobs = torch.tensor([[-3.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.0, -1.0]])
    advantages = torch.tensor([1.0])
    truncated, m = compute_decoupled_ppo_loss(logprobs, old, advantages, prox_logprobs=prox, behav_cap=2.0)
    assert truncated.item() == pytest.approx(-(2.0 + 1.0) / 2) and m["behav_capped_frac"] == 0.5  # e^2 → 2
    masked, m = compute_decoupled_ppo_loss(
        logprobs, old, advantages, prox_logprobs=prox, behav_cap=2.0, behav_cap_mode="mask"
    )
    assert masked.item() == pytest.approx(-(0.0 + 1.0) / 2) and m["behav_weight_max"] == 1.0
    with pytest.raises(ValueError, match="behav_cap"):
        compute_decoupled_ppo_loss(logprobs, old, advantages, behav_cap=0.0)


def test_the_trainer_gives_it_the_proximal_log_probs():
    loss = policy_loss("decoupled_ppo", behav_cap=5.0)
    assert loss.uses_proximal and not loss.uses_reference
    assert not policy_loss("ppo").uses_proximal
    with pytest.raises(ValueError, match="inputs of the loss"):
        policy_loss("decoupled_ppo", prox_logprobs=None)
