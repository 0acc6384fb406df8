from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrlhf.losses import compute_m2po_loss, m2po_mask


def greedy_reference(log_ratio: list[float], valid: list[bool], threshold: float) -> list[bool]:
    """Algorithm 1 of the M2PO paper, literally: drop the largest (log r)² until the mean fits."""
    kept = {i for i, v in enumerate(valid) if v}
    d = [x * x for x in log_ratio]
    while kept and sum(d[i] for i in kept) / len(kept) > threshold:
        kept.remove(max(kept, key=lambda i: (d[i], -i)))
    return [i in kept for i in range(len(log_ratio))]


def test_hand_computed_batch_mode():
    # log r = [0, 0.1, 1.0], A = 1, τ = 0.04. d = (log r)² = [0, 0.01, 1]; mean 0.337 > τ,
    # drop d = 1 → mean 0.005 ≤ τ. Kept ratios [1, e^0.1]; loss = −(1 + e^0.1) / 3 valid tokens.
    logprobs = torch.tensor([[0.0, 0.1, 1.0]])
    loss, metrics = compute_m2po_loss(logprobs, torch.zeros(1, 3), torch.ones(1), m2_threshold=0.04)
    assert loss.item() == pytest.approx(-(1 + math.exp(0.1)) / 3, abs=1e-6)
    assert metrics["masked_frac"] == pytest.approx(1 / 3)
    assert metrics["m2"] == pytest.approx((0 + 0.01 + 1) / 3, abs=1e-6)
    assert metrics["m2_kept"] == pytest.approx(0.005, abs=1e-6)
    assert metrics["clip_frac"] == 0.0  # batch mode does not clip by default


def test_hand_computed_token_mode():
    # r = [1, e^0.1 ≈ 1.105, e ≈ 2.718], threshold on r² = 2 keeps the first two (r² < 2).
    # clip 0.2 leaves both inside [0.8, 1.2]: loss = −(1 + e^0.1) / 2 kept tokens.
    logprobs = torch.tensor([[0.0, 0.1, 1.0]])
    loss, metrics = compute_m2po_loss(logprobs, torch.zeros(1, 3), torch.ones(1), m2_threshold=2.0, mode="token")
    assert loss.item() == pytest.approx(-(1 + math.exp(0.1)) / 2, abs=1e-6)
    assert metrics["masked_frac"] == pytest.approx(1 / 3)


def test_token_mode_warns_when_the_threshold_masks_everything():
    with pytest.warns(UserWarning, match="r = 1"):
        compute_m2po_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), m2_threshold=0.04, mode="token")


def test_on_policy_batch_keeps_every_token():
    lp = -torch.rand(4, 6)
    loss, metrics = compute_m2po_loss(lp, lp.clone(), torch.ones(4))
    assert metrics["masked_frac"] == 0.0
    assert loss.item() == pytest.approx(-1.0)


def test_bad_mode_and_threshold():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="mode"):
        compute_m2po_loss(lp, lp, torch.ones(1), mode="sequence")
    with pytest.raises(ValueError, match="m2_threshold"):
        compute_m2po_loss(lp, lp, torch.ones(1), m2_threshold=-1.0)


# Log-ratios whose square falls below float64's normal range (|x| < 1e-154) are
# squared to 0 by vectorised CPU kernels but not by Python; such tokens are on-policy
# for every purpose, so the comparison uses exact zeros for them.
log_ratios = st.floats(-2.0, 2.0, allow_nan=False).map(lambda x: 0.0 if abs(x) < 1e-100 else x)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda b: st.integers(1, 8).flatmap(
            lambda length: st.tuples(
                st.lists(log_ratios, min_size=b * length, max_size=b * length),
                st.lists(st.booleans(), min_size=b * length, max_size=b * length),
                st.just((b, length)),
            )
        )
    ),
    st.sampled_from([0.0, 0.01, 0.04, 0.3, 5.0]),
)
def test_batch_mask_equals_the_greedy_reference(data, threshold):
    values, valid, shape = data
    log_ratio = torch.tensor(values, dtype=torch.float64).reshape(shape)
    mask = torch.tensor(valid).reshape(shape)
    keep = m2po_mask(log_ratio, mask, threshold)
    assert keep.flatten().tolist() == greedy_reference(values, valid, threshold)
    kept = log_ratio[keep]
    if kept.numel():
        assert kept.square().mean().item() <= threshold + 1e-12
