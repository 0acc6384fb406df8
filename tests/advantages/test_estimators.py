"""The built-in advantage estimators against their definitions, and the registry's errors."""

from __future__ import annotations

import math
import random

import pytest

from asyncrlhf.advantages import advantage_estimators, apply_advantages, get_advantage, register_advantage
from asyncrlhf.buffers import GroupAwareReplayBuffer
from tests.buffers.helpers import make_exp


def batch(seed: int, groups: int = 5, size: int = 6) -> list[list[float]]:
    rng = random.Random(seed)
    return [[float(rng.random() < 0.4) + rng.random() * 0.1 for _ in range(size)] for _ in range(groups)]


def test_every_built_in_is_registered():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp"} <= set(advantage_estimators())


@pytest.mark.parametrize("seed", range(5))
def test_rloo_is_the_reward_minus_the_mean_of_the_others(seed):
    rewards = batch(seed)
    out = get_advantage("rloo")(rewards)
    for group, advantages in zip(rewards, out, strict=True):
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            assert advantages[i] == pytest.approx(r - sum(others) / len(others), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_centres_per_group_and_scales_by_the_batch_std(seed):
    rewards = batch(seed)
    out = get_advantage("reinforce_pp")(rewards)
    flat = [a for group in out for a in group]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9)
    assert math.sqrt(sum(a * a for a in flat) / len(flat)) == pytest.approx(1.0, abs=1e-6)  # one scale per batch
    for group, advantages in zip(rewards, out, strict=True):  # the order within each group is the rewards'
        assert sorted(range(len(group)), key=group.__getitem__) == sorted(range(len(group)), key=advantages.__getitem__)
    # GRPO scales each group by its own std instead: groups with a small spread get large advantages
    grpo = get_advantage("grpo")(rewards)
    assert all(abs(math.sqrt(sum(a * a for a in g) / len(g)) - 1.0) < 1e-6 for g in grpo if len(set(g)) > 1)


def test_equal_rewards_give_zeros_and_dr_grpo_is_unscaled():
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        assert get_advantage(name)([[0.3] * 4, [1.0] * 4]) == [[0.0] * 4, [0.0] * 4]
    assert get_advantage("dr_grpo")([[1.0, 0.0, 0.0, 0.0]]) == [[0.75, -0.25, -0.25, -0.25]]


def test_a_batch_level_estimator_sees_the_whole_batch():
    exps = [[make_exp("a", reward=r) for r in (1.0, 0.0)], [make_exp("b", reward=r) for r in (3.0, 1.0)]]
    apply_advantages(get_advantage("reinforce_pp"), exps)
    # centred: ±0.5 and ±1.0; batch std sqrt((0.25·2 + 1·2)/4) = sqrt(0.625)
    scale = math.sqrt(0.625)
    assert [e.advantage for g in exps for e in g] == pytest.approx([0.5 / scale, -0.5 / scale, 1 / scale, -1 / scale])


def test_the_buffer_applies_its_estimator_or_leaves_advantages_to_the_runtime():
    for advantage, expected in (("rloo", [1.0, -1.0]), (None, [None, None])):
        buf = GroupAwareReplayBuffer(group_size=2, advantage=advantage)
        buf.push(make_exp("p", reward=1.0))
        buf.push(make_exp("p", reward=0.0))
        assert [e.advantage for e in buf.sample(1)[0]] == expected


def test_registry_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope': registered are \(.*'grpo'"):
        get_advantage("nope")
    with pytest.raises(ValueError, match="rloo needs at least 2 completions per prompt"):
        get_advantage("rloo")([[1.0]])
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_advantage("grpo")(lambda rewards: rewards)
    from asyncrlhf.advantages.registry import Estimator

    bad = Estimator("bad_shape", lambda rewards: [[0.0] for _ in rewards])  # not registered: nothing to undo
    with pytest.raises(ValueError, match="returned groups of \\[1\\] advantages for groups of \\[2\\] rewards"):
        bad([[1.0, 0.0]])
