from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrlhf.losses import compute_m2po_loss, m2po_mask
from asyncrlhf.losses.m2po import _sorted_keep


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
    d = log_ratio.square().masked_fill(~mask, 0.0).flatten()
    assert torch.equal(_sorted_keep(d, mask, threshold), keep)  # CUDA's path
    kept = log_ratio[keep]
    if kept.numel():
        assert kept.square().mean().item() <= threshold + 1e-12


def sorted_reference(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """The batch rule by one full stable sort (the implementation ``m2po_mask`` replaced)."""
    d = torch.where(mask, log_ratio.double().square(), -1.0).flatten()
    order = torch.argsort(d, descending=True, stable=True)
    d_sorted = d[order].clamp_min(0.0)
    kept_sum = torch.flip(torch.cumsum(torch.flip(d_sorted, (0,)), 0), (0,))
    k = torch.arange(d.numel())
    kept_count = (mask.sum() - k).clamp_min(0)
    satisfied = torch.cat([(kept_sum <= threshold * kept_count) | (kept_count == 0), torch.ones(1, dtype=torch.bool)])
    keep_sorted = k >= torch.argmax(satisfied.to(torch.uint8))
    return torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted).view_as(mask) & mask


@pytest.mark.parametrize("sigma", [0.1, 0.3, 1.0, 3.0])  # drops ~0% to ~95%: the top-k window grows
@pytest.mark.parametrize("threshold", [0.0, 0.04, 0.5])
@pytest.mark.parametrize("quantum", [None, 0.05])  # rounded log-ratios: many ties at the cut
def test_large_batch_mask_equals_the_full_sort(sigma, threshold, quantum):
    g = torch.Generator().manual_seed(int(sigma * 10) + int(threshold * 100))
    log_ratio = torch.randn(64, 700, generator=g) * sigma
    if quantum is not None:
        log_ratio = torch.round(log_ratio / quantum) * quantum
    log_ratio[3, 5] = float("inf")  # an overflowing ratio is always dropped first
    mask = torch.rand(64, 700, generator=g) > 0.2
    keep = m2po_mask(log_ratio, mask, threshold)
    assert torch.equal(keep, sorted_reference(log_ratio, mask, threshold))
    assert not keep[3, 5]
    # the sort CUDA takes (no host sync), here on the CPU
    d = log_ratio.double().square().masked_fill(~mask, 0.0).flatten()
    assert torch.equal(_sorted_keep(d, mask, threshold), keep)


@pytest.mark.parametrize("threshold", [0.0, 0.04, 0.5])
def test_the_batch_mask_on_the_inputs_device_is_the_cpu_mask(device, threshold):
    g = torch.Generator().manual_seed(7)
    log_ratio = torch.round(torch.randn(64, 700, generator=g) * 0.3 / 0.05) * 0.05  # ties at the cut
    mask = torch.rand(64, 700, generator=g) > 0.2
    keep = m2po_mask(log_ratio.to(device), mask.to(device), threshold)
    assert keep.device.type == device.type
    assert torch.equal(keep.cpu(), m2po_mask(log_ratio, mask, threshold))
