from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.losses import compute_grpo_loss, group_advantages

# Two on-policy sequences (r = 1), A = [1, −1], valid lengths 3 and 1: per-token loss is −A.
LP = torch.zeros(2, 3)
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("loss_agg", "expected"),
    [
        ("token-mean", (-1 * 3 + 1 * 1) / 4),  # all valid tokens weigh the same: −0.5
        ("seq-mean-token-mean", (-1 + 1) / 2),  # each sequence's own mean: 0
        ("seq-mean-token-sum-norm", (-3 / 5 + 1 / 5) / 2),  # token sums over the budget 5: −0.2
    ],
)
def test_loss_aggregations(loss_agg, expected):
    loss, metrics = compute_grpo_loss(LP, LP, ADV, MASK, loss_agg=loss_agg, norm_length=5)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["kl"] == 0.0


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_no_aggregation_changes_with_extra_padding(loss_agg):
    """Dr. GRPO's sum-norm divides by a constant (the generation budget), not by the
    batch's padded width: padding a 2×4 batch to 2×8 used to halve the loss."""
    lp, old = torch.tensor([[-0.5, -1.0, -0.2, 0.0], [-0.3, 0.0, 0.0, 0.0]]), torch.full((2, 4), -0.6)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    pad = torch.zeros(2, 4)
    wide = [torch.cat([t, pad], dim=1) for t in (lp, old, mask)]
    narrow_loss, _ = compute_grpo_loss(lp, old, ADV, mask, loss_agg=loss_agg, norm_length=5)
    wide_loss, _ = compute_grpo_loss(wide[0], wide[1], ADV, wide[2].int(), loss_agg=loss_agg, norm_length=5)
    assert wide_loss.item() == pytest.approx(narrow_loss.item(), abs=1e-7)


def test_sum_norm_needs_its_constant():
    with pytest.raises(ValueError, match="norm_length"):
        compute_grpo_loss(LP, LP, ADV, MASK, loss_agg="seq-mean-token-sum-norm")


def test_k3_kl_to_the_reference():
    # ref − logprob = ln 2 on every token: k3 = e^{ln 2} − ln 2 − 1 = 1 − ln 2 ≈ 0.30685.
    ref = LP + math.log(2.0)
    k3 = 1 - math.log(2.0)
    loss, metrics = compute_grpo_loss(LP, LP, ADV, MASK, ref_logprobs=ref, kl_coef=0.1, loss_agg="token-mean")
    assert metrics["kl"] == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(-0.5 + 0.1 * k3, abs=1e-6)
    # Without a coefficient the KL is reported but not optimised.
    loss, metrics = compute_grpo_loss(LP, LP, ADV, MASK, ref_logprobs=ref, loss_agg="token-mean")
    assert loss.item() == pytest.approx(-0.5, abs=1e-6) and metrics["kl"] == pytest.approx(k3, abs=1e-6)


def test_bad_loss_agg_and_kl_coef():
    with pytest.raises(ValueError, match="loss_agg"):
        compute_grpo_loss(LP, LP, ADV, loss_agg="sum")
    with pytest.raises(ValueError, match="kl_coef"):
        compute_grpo_loss(LP, LP, ADV, kl_coef=-1.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_grpo_loss(LP, LP, ADV, ref_logprobs=torch.zeros(2, 4))


def test_group_advantages_hand_computed():
    # Group 1: [1, 0] → μ = 0.5, σ = 0.5 → [1, −1] (up to eps). Group 2: [1, 1] → zeros.
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-6)
    # Dr. GRPO: no std division.
    drgrpo = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2, scale=False)
    assert drgrpo.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_group_advantages_keep_the_input_layout():
    rewards = torch.tensor([[3.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    adv = group_advantages(rewards, group_size=3)
    assert adv.shape == (2, 3)
    assert adv[0].tolist() == pytest.approx([1.2247449, -1.2247449, 0.0], abs=1e-5)  # ±1/√(2/3)


def test_equal_rewards_give_exact_zeros_never_nan():
    # 0.1 is not exact in binary: a naive (R − μ)/(σ + eps) turns rounding into ±O(1).
    rewards = torch.full((12,), 0.1)
    adv = group_advantages(rewards, group_size=3)
    assert (adv == 0).all()
    assert (group_advantages(torch.ones(4), group_size=1) == 0).all()


@pytest.mark.parametrize("group_size", [0, -2, 1.5])
def test_group_size_must_be_positive(group_size):
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.ones(4), group_size=group_size)


def test_rewards_must_split_into_groups():
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(torch.ones(4), group_size=3)


def test_scalar_twin_matches_the_tensor_version():
    from asyncrlhf.advantages import group_advantages_scalar

    g = torch.Generator().manual_seed(0)
    for scale in (True, False):
        for _ in range(50):
            rewards = (torch.rand(6, generator=g) * 3).round(decimals=1)
            expected = group_advantages(rewards, group_size=6, scale=scale).tolist()
            assert group_advantages_scalar(rewards.tolist(), scale=scale) == pytest.approx(expected, abs=1e-5)
    assert group_advantages_scalar([0.1] * 3) == [0.0, 0.0, 0.0]
