from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.losses import compute_gspo_loss, policy_losses


def test_hand_computed_sequence_ratio_clip():
    # Sequence 0: mean log r = 0.1, s = e^0.1 > 1 + 4e-4 with A = +1: clipped, no gradient.
    # Sequence 1: its two valid tokens are on-policy, s = 1, A = −1: unclipped.
    logprobs = torch.tensor([[0.1, -0.1, 0.3], [0.0, 0.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([1.0, -1.0])
    loss, metrics = compute_gspo_loss(logprobs, torch.zeros(2, 3), advantages, mask, loss_agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-((1 + 4e-4) * 1.0 + 1.0 * -1.0) / 2, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logprobs)
    # d/dlp of −½·s₁·A₁ with s₁ = exp(mean of 2 tokens): −½·A₁·s₁·½ = 0.25 on each valid token.
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]]), atol=1e-6)
    assert metrics["clip_frac"] == pytest.approx(3 / 5) and metrics["seq_ratio_max"] == pytest.approx(math.exp(0.1))


def test_one_runaway_token_moves_the_sequence_ratio_by_its_share():
    """Per-token PPO would give the runaway token r = e^3; GSPO's s is e^(3/4)."""
    logprobs = torch.tensor([[0.0, 0.0, 0.0, 3.0]])
    _, metrics = compute_gspo_loss(logprobs, torch.zeros(1, 4), torch.tensor([1.0]), clip_eps=0.5, clip_eps_high=0.5)
    assert metrics["seq_ratio_mean"] == pytest.approx(math.exp(0.75)) and metrics["ratio_max"] == pytest.approx(
        math.exp(3.0)
    )


def test_registered_and_checked():
    assert "gspo" in policy_losses()
    with pytest.raises(ValueError, match="clip_eps"):
        compute_gspo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0]), clip_eps=0.0)
