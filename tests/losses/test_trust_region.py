"""M2PO's trust-region rule against a transcription of the authors' released code, the
non-finite cases every objective must survive, and clip-higher."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrlhf.losses import (
    compute_decoupled_ppo_loss,
    compute_grpo_loss,
    compute_m2po_loss,
    compute_ppo_loss,
    policy_loss,
    policy_losses,
    trust_region_cap,
)


# ----------------------------------------------------------------------------------------
# A transcription of Infini-AI-Lab/M2PO (verl/trainer/ppo/core_algos.py, commit af54a3e):
# _solve_tau_from_sorted_delta2, _get_trust_region_tokens_delta_sq, kpo_clip_harmful_tokens
# and compute_m2po_policy_loss, kept loop for loop (without prints and statistics); the
# only change is taking per-token advantages instead of advantages[:, 0]. Called as their
# actor calls it: float32 log-probs, no floors.
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


def _reference_loss(old_log_prob, log_prob, advantages, response_mask, budget, miniclip_low, miniclip_high):
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
        # as their code maps τ to the bounds: torch.tensor(τ) is float32, so the bound is
        # exactly a float32 ratio, and the token at the cap (r == bound) keeps its gradient
        clip_low = float(torch.exp(torch.tensor(-tau)).item())
        clip_high = float(torch.exp(torch.tensor(+tau)).item())
    clip_low, clip_high = 1 - clip_low, clip_high - 1
    if miniclip_low is not None and clip_low < miniclip_low:
        clip_low = miniclip_low
    if miniclip_high is not None and clip_high < miniclip_high:
        clip_high = miniclip_high
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    losses = torch.maximum(pg_losses1, pg_losses2)
    return (losses * response_mask).sum() / response_mask.sum()  # verl's masked_mean: token-mean


def stale_batch(sigma: float, seed: int, shape=(16, 12), dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = (-torch.rand(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    logprobs = (old + sigma * torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)).requires_grad_()
    advantages = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape).to(dtype)
    lengths = torch.randint(3, shape[1] + 1, (shape[0],), generator=g)
    mask = (torch.arange(shape[1])[None, :] < lengths[:, None]).to(dtype)
    return logprobs, old, advantages, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 16), (64, 256)])
@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_trust_region_defaults_match_the_authors_run_path_in_value_and_gradient(sigma, seed, shape, dtype):
    """Their actor (verl/workers/actor/dp_actor.py) passes ``config.get("miniclip_low", None)``
    and no training script sets it: the runs behind the paper had no floors. The token at
    the cap keeps its gradient in both (its ratio equals the bound: torch.clamp is
    inclusive), so the clipped tokens are the same ones."""
    logprobs, old, advantages, mask = stale_batch(sigma, seed, shape, dtype)
    ours, metrics = compute_m2po_loss(logprobs, old, advantages, mask, m2_threshold=0.04, mode="trust_region")
    (grad,) = torch.autograd.grad(ours, logprobs)
    reference = _reference_loss(old, logprobs, advantages, mask, 0.04, miniclip_low=None, miniclip_high=None)
    (grad_ref,) = torch.autograd.grad(reference, logprobs)
    assert ours.item() == pytest.approx(reference.item(), abs=1e-6)
    assert (grad - grad_ref).abs().max().item() <= 1e-6
    silenced = ((grad_ref == 0) & (mask > 0) & (advantages != 0)).sum() / mask.sum()  # tokens the clip binds
    assert metrics["clip_frac"] == pytest.approx(silenced.item(), abs=1e-6)
    assert metrics["m2_trust_region"] > 0.04 and 0 < metrics["clip_frac"] < 1  # stale: the budget binds


@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_the_floors_when_asked_match_the_authors_function_defaults(sigma):
    logprobs, old, advantages, mask = stale_batch(sigma, 3)
    ours, metrics = compute_m2po_loss(
        logprobs, old, advantages, mask, mode="trust_region", min_clip_low=0.3, min_clip_high=0.5
    )
    reference = _reference_loss(old, logprobs, advantages, mask, 0.04, miniclip_low=0.3, miniclip_high=0.5)
    (grad,), (grad_ref,) = torch.autograd.grad(ours, logprobs), torch.autograd.grad(reference, logprobs)
    assert ours.item() == pytest.approx(reference.item(), abs=1e-5) and torch.allclose(grad, grad_ref, atol=1e-5)
    assert metrics["clip_low"] == pytest.approx(0.7) and metrics["clip_high"] >= 1.5  # the floors bind here
    unfloored, _ = compute_m2po_loss(logprobs, old, advantages, mask, mode="trust_region")
    assert abs(unfloored.item() - ours.item()) > 1e-3  # and they change the loss: the default is not a no-op


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
# Finite everywhere: every registered objective, any finite current log-probs, any
# behaviour log-probs (−inf included), log-ratios up to ±100 (r = e^100 overflows float32).
_OPTIONS = {
    "m2po": [
        {"mode": "trust_region"},
        {"mode": "batch"},
        {"mode": "token", "m2_threshold": 4.0},
        {"mode": "batch", "clip_eps": 0.2},
    ],
    "decoupled_ppo": [{}, {"behav_cap": 5.0}, {"clip_ratio_c": 3.0}],
    "ppo": [{}, {"clip_ratio_c": 3.0}],
    "grpo": [{}, {"clip_ratio_c": 3.0}],
}
_CASES = [(name, options) for name in policy_losses() for options in _OPTIONS.get(name, [{}])]


def _bound_loss(name, options):
    loss = policy_loss(name, **options)
    return lambda lp, old, adv, mask: loss(
        lp, old, adv, mask, ref_logprobs=lp.detach() - 1.0, prox_logprobs=lp.detach() * 0.5
    )


def test_every_registered_objective_is_covered():
    assert {name for name, _ in _CASES} == set(policy_losses()) and len(policy_losses()) >= 5


@pytest.mark.filterwarnings("ignore:m2po mode='token'")
@pytest.mark.parametrize(("name", "options"), _CASES, ids=[f"{n}-{o}" for n, o in _CASES])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    old=st.lists(st.one_of(st.floats(-30.0, 0.0), st.just(-math.inf)), min_size=6, max_size=6),
    shift=st.lists(st.floats(-100.0, 100.0), min_size=6, max_size=6),
    advantages=st.lists(st.floats(-3.0, 3.0), min_size=2, max_size=2),
)
def test_any_log_ratio_gives_a_finite_loss_and_gradient(name, options, old, shift, advantages):
    old_t = torch.tensor(old).view(2, 3)
    logprobs = (torch.where(torch.isinf(old_t), -5.0, old_t) + torch.tensor(shift).view(2, 3)).requires_grad_()
    loss, metrics = _bound_loss(name, options)(logprobs, old_t, torch.tensor(advantages), torch.ones(2, 3))
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all(), (loss, grad)
    assert all(math.isfinite(v) for k, v in metrics.items() if k != "ratio_max"), metrics


@pytest.mark.parametrize(("name", "options"), _CASES, ids=[f"{n}-{o}" for n, o in _CASES])
@pytest.mark.filterwarnings("ignore:m2po mode='token'")
@pytest.mark.parametrize(
    "case",
    [
        (torch.tensor([[0.0, 0.05, 100.0]]), torch.zeros(1, 3), 1.0),  # r = e^100, A > 0
        (torch.tensor([[0.0, 0.05, 100.0]]), torch.zeros(1, 3), -1.0),  # r = e^100, A < 0: harmful, PPO leaves it
        (torch.tensor([[0.0, -0.1, -0.2]]), torch.tensor([[0.0, -0.1, float("-inf")]]), 1.0),  # old = -inf
    ],
    ids=["overflowing-ratio", "overflowing-ratio-negative-advantage", "old-logprob-minus-inf"],
)
def test_a_runaway_token_gives_a_finite_loss_and_no_gradient(name, options, case):
    """``compute_m2po_loss([[0, .05, 100]], 0, A=-1, mode="trust_region")`` was ``inf``: a
    harmful-direction token is never clipped there, as in PPO. The bounded log-ratio
    (±20, verl's bound) keeps it finite and gives the runaway token no gradient."""
    logprobs, old, advantage = case[0].clone().requires_grad_(), case[1], case[2]
    loss, _ = _bound_loss(name, options)(logprobs, old, torch.tensor([advantage]), torch.ones(1, 3))
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all(), (loss, grad)
    if name not in ("decoupled_ppo", "gspo"):  # their ratios are around π_prox / the sequence mean
        assert grad[0, 2] == 0.0


def test_the_dual_clip_bounds_a_harmful_token_at_c_times_a():
    log_ratio = torch.log(torch.tensor([[1.0, 10.0]]))  # r = 10, A < 0: the PPO clip does not bind
    loss, _ = compute_ppo_loss(log_ratio, torch.zeros(1, 2), torch.tensor([-1.0]))
    dual, metrics = compute_ppo_loss(log_ratio, torch.zeros(1, 2), torch.tensor([-1.0]), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((1.0 + 10.0) / 2) and dual.item() == pytest.approx((1.0 + 3.0) / 2)
    assert metrics["clip_frac"] == 0.5
    reference = torch.tensor([[1.0, 10.0]]).log().requires_grad_()  # verl's compute_policy_loss, transcribed
    ratio, adv = torch.exp(reference), torch.tensor([[-1.0, -1.0]])
    clip1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
    verl = torch.where(adv < 0, torch.min(-adv * 3.0, clip1), clip1).mean()
    assert dual.item() == pytest.approx(verl.item())
    for fn in (compute_ppo_loss, compute_grpo_loss, compute_decoupled_ppo_loss):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            fn(log_ratio, torch.zeros(1, 2), torch.tensor([-1.0]), clip_ratio_c=1.0)


def test_clip_higher_bounds_each_side_on_its_own():
    log_ratio = torch.log(torch.tensor([[1.25, 1.25, 0.75, 0.75]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    _, symmetric = compute_ppo_loss(log_ratio, torch.zeros(1, 4), advantages, clip_eps=0.2)
    loss, higher = compute_ppo_loss(log_ratio, torch.zeros(1, 4), advantages, clip_eps=0.2, clip_eps_high=0.28)
    assert symmetric["clip_frac"] == 1.0  # r = 1.25 > 1.2 (A > 0) and 0.75 < 0.8 (A < 0): all clipped
    assert higher["clip_frac"] == 0.5  # 1.25 < 1.28: the upper side no longer binds; the lower still does
    assert loss.item() == pytest.approx(-(1.25 + 1.25 - 0.8 - 0.8) / 4, abs=1e-6)
