from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.losses import compute_grpo_loss, compute_m2po_loss, compute_ppo_loss

ALL_LOSSES = [compute_ppo_loss, compute_m2po_loss, compute_grpo_loss]


def test_hand_computed_value():
    # ratios r = [1.5, 0.5, 1.1, 0.5], advantages A = [1, −1, 1, 1], ε = 0.2
    #   token 0: min(1.5·1, 1.2·1)   = 1.2   (clipped)
    #   token 1: min(0.5·−1, 0.8·−1) = −0.8  (clipped)
    #   token 2: min(1.1, 1.1)       = 1.1
    #   token 3: min(0.5, 0.8)       = 0.5
    # loss = −(1.2 − 0.8 + 1.1 + 0.5) / 4 = −0.5; clip_frac = 2/4
    old = torch.zeros(1, 4)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5]]))
    loss, metrics = compute_ppo_loss(logprobs, old, torch.tensor([[1.0, -1.0, 1.0, 1.0]]), clip_eps=0.2)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.5) / 4)


def test_identical_policies_give_ratio_one_and_minus_mean_advantage():
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 5)
    advantages = torch.tensor([0.5, -2.0, 1.0])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    loss, metrics = compute_ppo_loss(logprobs, logprobs.clone(), advantages, mask)
    # masked token mean of A: (3·0.5 + 5·−2 + 1·1) / 9 = −7.5 / 9
    assert loss.item() == pytest.approx(7.5 / 9, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["ratio_max"] == pytest.approx(1.0)
    assert metrics["clip_frac"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_clipping_bounds_the_objective(advantage):
    # However far the ratio moves in the advantage's favour, the objective stays at (1 ± ε)·A.
    old = torch.zeros(1, 3)
    push = math.log(10.0) if advantage > 0 else math.log(0.01)
    loss, metrics = compute_ppo_loss(torch.full((1, 3), push), old, torch.tensor([advantage]), clip_eps=0.2)
    bound = 1.2 if advantage > 0 else 0.8
    assert loss.item() == pytest.approx(-bound * advantage, abs=1e-6)
    assert metrics["clip_frac"] == 1.0


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_zero_advantages_give_zero_loss_and_finite_gradients(loss_fn):
    logprobs = torch.randn(2, 4, requires_grad=True)
    old = logprobs.detach() + 0.3 * torch.randn(2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss, _ = loss_fn(logprobs, old, torch.zeros(2), mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(logprobs.grad).all()


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_gradients_flow_only_through_valid_tokens(loss_fn):
    logprobs = (-torch.rand(2, 4)).requires_grad_()
    old = logprobs.detach().clone()
    old[:, 2:] = float("-inf")  # garbage behaviour log-probs on padding must not leak NaN
    mask = torch.tensor([[True, True, False, False], [True, True, False, False]])
    loss, metrics = loss_fn(logprobs, old, torch.tensor([1.0, -0.5]), mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert (logprobs.grad[:, 2:] == 0).all()
    assert (logprobs.grad[:, :2] != 0).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_bad_shapes_and_dtypes_name_the_argument(loss_fn):
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="logprobs"):
        loss_fn(torch.zeros(6), torch.zeros(6), torch.zeros(6))
    with pytest.raises(ValueError, match="old_logprobs"):
        loss_fn(lp, torch.zeros(2, 4), torch.zeros(2))
    with pytest.raises(ValueError, match="advantages"):
        loss_fn(lp, lp, torch.zeros(3))
    with pytest.raises(ValueError, match="mask"):
        loss_fn(lp, lp, torch.zeros(2), torch.ones(3, 2))
    with pytest.raises(TypeError, match="advantages"):
        loss_fn(lp, lp, torch.zeros(2, dtype=torch.long))


def test_clip_eps_is_checked():
    with pytest.raises(ValueError, match="clip_eps"):
        compute_ppo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), clip_eps=1.5)


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_runs_on_the_inputs_device(loss_fn, device):
    lp = torch.zeros(2, 3, device=device, requires_grad=True)
    loss, _ = loss_fn(lp, lp.detach(), torch.ones(2, device=device))
    assert loss.device == lp.device
