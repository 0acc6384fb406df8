"""M2PO's trust-region rule against a transcription of the authors' released code, the
non-finite cases every objective must survive, and clip-higher."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrlhf.losses import (
    compute_decoupled_ppo_loss,
    compute_grpo_loss,
    compute_gspo_loss,
    compute_m2po_loss,
    compute_ppo_loss,
    trust_region_cap,
)


# ----------------------------------------------------------------------------------------
# A transcription of Infini-AI-Lab/M2PO (verl/trainer/ppo/core_algos.py, commit af54a3e):
# _solve_tau_from_sorted_delta2, _get_trust_region_tokens_delta_sq, kpo_clip_harmful_tokens
# and compute_m2po_policy_loss, kept loop for loop (in float64, without prints and
# statistics); the only change is taking per-token advantages instead of advantages[:, 0].
def _solve_tau(sorted_delta2: torch.Tensor, target_sum: float) -> tuple[float, float]:
    total = float(sorted_delta2.sum().item())
    if target_sum >= total - 1e-12:
        return 100000.0, total / sorted_delta2.numel()
    csum = torch.cumsum(sorted_delta2, dim=0)
    n = sorted_delta2.numel()
    for k in range(0, n):
        left_sum = float(csum[k].item())
        rest = n - k - 1
        m2 = sorted_delta2[k].item() - 1e-12
        if m2 * rest + left_sum >= target_sum - 1e-12:
            if k == 0:
                return 0.0, csum[-1].item() / n
            m2_after = (sorted_delta2[k - 1].item() * (rest + 1) + float(csum[k - 1].item())) / n
            return float(sorted_delta2[k - 1].item() - 1e-12) ** 0.5, m2_after
    return 100000.0, total / n


def _reference_loss(old_log_prob, log_prob, advantages, response_mask, budget, miniclip_low=0.3, miniclip_high=0.5):
    mask = response_mask.bool()
    delta = old_log_prob - log_prob.detach()
    ratio = torch.exp(-delta)
    harmful = mask & (((advantages > 1e-12) & (ratio > 1.0 + 1e-12)) | ((advantages < -1e-12) & (ratio < 1.0 - 1e-12)))
    tr_delta_sq = delta.pow(2)[harmful]
    n = tr_delta_sq.numel()
    if n == 0 or float(tr_delta_sq.sum().item() / n) <= budget + 1e-12:
        clip_low, clip_high = 0.0, 100000.0
    else:
        tau, _ = _solve_tau(torch.sort(tr_delta_sq)[0], budget * float(n))
        clip_low, clip_high = math.exp(-tau), math.exp(tau)
    clip_low, clip_high = 1 - clip_low, clip_high - 1
    clip_low, clip_high = max(clip_low, miniclip_low), max(clip_high, miniclip_high)
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    losses = torch.maximum(pg_losses1, pg_losses2)
    return (losses * response_mask).sum() / response_mask.sum()  # verl's masked_mean: token-mean


def stale_batch(sigma: float, seed: int, shape=(16, 12)):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    logprobs = (old + sigma * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()
    advantages = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape)
    lengths = torch.randint(3, shape[1] + 1, (shape[0],), generator=g)
    mask = (torch.arange(shape[1])[None, :] < lengths[:, None]).double()
    return logprobs, old, advantages, mask


@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trust_region_matches_the_authors_code_in_value_and_gradient(sigma, seed):
    logprobs, old, advantages, mask = stale_batch(sigma, seed)
    ours, metrics = compute_m2po_loss(logprobs, old, advantages, mask, m2_threshold=0.04, mode="trust_region")
    (grad,) = torch.autograd.grad(ours, logprobs)
    reference = _reference_loss(old, logprobs, advantages, mask, 0.04)
    (grad_ref,) = torch.autograd.grad(reference, logprobs)
    assert ours.item() == pytest.approx(reference.item(), abs=1e-5)
    assert torch.allclose(grad, grad_ref, atol=1e-5)
    assert metrics["m2_trust_region"] > 0.04 and 0 < metrics["clip_frac"] < 1  # stale: the budget binds


def test_the_cap_meets_the_budget_and_within_budget_nothing_is_clipped():
    logprobs, old, advantages, mask = stale_batch(0.5, 7)
    tau, m2, m2_after = trust_region_cap(logprobs.detach() - old, advantages, mask, 0.04)
    assert m2 > 0.04 >= m2_after - 1e-12 and 0 < tau < math.inf
    near, old_near = old + 0.01, old  # σ = 0.01: M2 = 1e-4, within any sensible budget
    loss, metrics = compute_m2po_loss(near, old_near, advantages, mask, mode="trust_region")
    unclipped = -((torch.exp(near - old_near) * advantages) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(unclipped.item(), abs=1e-12) and metrics["clip_frac"] == 0.0
    assert metrics["tau"] == -1.0 and metrics["clip_high"] == -1.0  # unbounded


# ----------------------------------------------------------------------------------------
def _every_objective():
    yield "ppo", lambda lp, old, adv, mask: compute_ppo_loss(lp, old, adv, mask)
    yield "grpo", lambda lp, old, adv, mask: compute_grpo_loss(lp, old, adv, mask)
    yield "gspo", lambda lp, old, adv, mask: compute_gspo_loss(lp, old, adv, mask)
    yield (
        "decoupled_ppo",
        lambda lp, old, adv, mask: compute_decoupled_ppo_loss(
            lp, old, adv, mask, prox_logprobs=lp.detach() * 0.5, behav_cap=5.0
        ),
    )
    for mode, bound in (("trust_region", 0.04), ("batch", 0.04), ("token", 4.0)):
        yield (
            f"m2po-{mode}",
            lambda lp, old, adv, mask, mode=mode, bound=bound: compute_m2po_loss(
                lp, old, adv, mask, m2_threshold=bound, mode=mode
            ),
        )
    yield "m2po-batch-clip", lambda lp, old, adv, mask: compute_m2po_loss(lp, old, adv, mask, clip_eps=0.2)


@pytest.mark.parametrize(("name", "loss_fn"), list(_every_objective()), ids=[n for n, _ in _every_objective()])
@pytest.mark.parametrize(
    "case",
    [
        (torch.tensor([[0.0, 0.05, 100.0]]), torch.zeros(1, 3)),  # r = e^100 overflows float32
        (torch.tensor([[0.0, -0.1, -0.2]]), torch.tensor([[0.0, -0.1, float("-inf")]])),  # old = -inf, valid
    ],
    ids=["overflowing-ratio", "old-logprob-minus-inf"],
)
def test_an_overflowing_ratio_gives_a_finite_loss_and_gradient(name, loss_fn, case):
    """``0·inf`` in ``-(objective * keep)`` made the loss NaN and the trainer skip the batch."""
    logprobs, old = case[0].clone().requires_grad_(), case[1]
    loss, _ = loss_fn(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3))
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all(), (loss, grad)
    if name != "decoupled_ppo":  # its clip is around π_prox, which did not run away: the capped weight remains
        assert grad[0, 2] == 0.0  # the runaway token is dropped or clipped: no gradient


def test_clip_higher_bounds_each_side_on_its_own():
    log_ratio = torch.log(torch.tensor([[1.25, 1.25, 0.75, 0.75]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    _, symmetric = compute_ppo_loss(log_ratio, torch.zeros(1, 4), advantages, clip_eps=0.2)
    loss, higher = compute_ppo_loss(log_ratio, torch.zeros(1, 4), advantages, clip_eps=0.2, clip_eps_high=0.28)
    assert symmetric["clip_frac"] == 1.0  # r = 1.25 > 1.2 (A > 0) and 0.75 < 0.8 (A < 0): all clipped
    assert higher["clip_frac"] == 0.5  # 1.25 < 1.28: the upper side no longer binds; the lower still does
    assert loss.item() == pytest.approx(-(1.25 + 1.25 - 0.8 - 0.8) / 4, abs=1e-6)
