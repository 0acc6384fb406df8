"""Buffers keep their invariants under every bad argument, and a bad reward costs its row
only (issue: reliability, second pass, items 8 and 10)."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from asyncrlhf.advantages import group_advantages_scalar
from asyncrlhf.buffers import BoundedReplayBuffer, GroupAwareReplayBuffer, VersionedReplayBuffer
from asyncrlhf.orchestration import VersionManager
from asyncrlhf.rollout.stub import StubEngine
from asyncrlhf.rollout.worker import RolloutWorker
from asyncrlhf.tasks.base import Problem
from asyncrlhf.types import Experience
from tests.buffers.helpers import make_exp


def buffers():
    versions = VersionManager()
    return [
        BoundedReplayBuffer(8),
        VersionedReplayBuffer(8, max_staleness=2, version=versions),
        GroupAwareReplayBuffer(group_size=1, max_groups=8),
    ]


def balanced(buf) -> bool:
    s = buf.stats()
    return s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)


@pytest.mark.parametrize("buf", buffers(), ids=lambda b: type(b).__name__)
@pytest.mark.parametrize("timeout", [math.nan, -1.0, "1", True])
def test_a_timeout_that_is_not_a_duration_is_refused_naming_it(buf, timeout):
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0"):
        buf.sample(1, timeout=timeout)


def waiting_sampler(buf) -> tuple[threading.Thread, list]:  # type: ignore[no-untyped-def]
    """A thread blocked in ``buf.sample(1, timeout=inf)``, and where its result lands."""
    got: list = []
    sampler = threading.Thread(target=lambda: got.append(buf.sample(1, timeout=math.inf)))
    sampler.start()
    time.sleep(0.2)
    assert sampler.is_alive() and got == []  # still waiting
    return sampler, got


@pytest.mark.parametrize("buf", buffers(), ids=lambda b: type(b).__name__)
def test_an_infinite_timeout_waits_until_the_data_comes(buf):
    """``timeout=inf`` used to raise OverflowError inside ``Condition.wait``."""
    sampler, got = waiting_sampler(buf)
    buf.push(make_exp(prompt_id="late"))
    sampler.join(timeout=10)
    assert not sampler.is_alive() and len(got) == 1 and len(got[0]) == 1 and balanced(buf)


@pytest.mark.parametrize("buf", buffers(), ids=lambda b: type(b).__name__)
def test_an_infinite_timeout_ends_when_the_buffer_closes(buf):
    sampler, got = waiting_sampler(buf)
    buf.close()
    sampler.join(timeout=10)
    assert not sampler.is_alive() and got == [[]]


def test_an_unhashable_prompt_id_is_refused_before_any_buffer_counts_it():
    buf = GroupAwareReplayBuffer(group_size=2)
    with pytest.raises(TypeError, match="prompt_id must be hashable"):
        buf.push(make_exp(prompt_id=["a", "list"]))
    assert buf.stats()["pushed"] == 0 and balanced(buf)


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_refused_by_the_experience(reward):
    with pytest.raises(ValueError, match="reward must be a finite number"):
        make_exp(reward=reward)


def test_groups_that_never_complete_are_bounded_by_max_groups():
    """300k never-completed groups were all kept despite ``max_groups=16``."""
    buf = GroupAwareReplayBuffer(group_size=4, max_groups=16)
    for i in range(300_000):
        buf.push(make_exp(prompt_id=i))  # one of four: never completes
    stats = buf.stats()
    assert stats["pending"] == 16 and stats["dropped_overflow"] == 300_000 - 16 and balanced(buf)
    for _ in range(3):  # the newest incomplete groups are the ones kept: they can still complete
        buf.push(make_exp(prompt_id=299_999))
    assert buf.num_ready_groups == 1 and balanced(buf)


def test_huge_rewards_give_the_advantages_of_their_order():
    """Squaring 1e308 overflowed the std to inf, and every advantage became 0."""
    assert group_advantages_scalar([1e308, 0.0]) == [1.0, -1.0]
    assert group_advantages_scalar([1.7e308, -1.7e308, -1.7e308]) == pytest.approx([2**0.5, -(0.5**0.5), -(0.5**0.5)])
    assert group_advantages_scalar([1.0, 0.0, 1.0, 1.0]) == pytest.approx([0.57735, -1.73205, 0.57735, 0.57735], 1e-4)


def test_a_reward_function_returning_non_finite_scores_costs_those_rows_only():
    """A NaN score failed the run ("every experience needs an advantage"); inf trained
    nothing. Each is now an error of its row: scored 0, counted as reward/nonfinite."""

    def unruly(ids: torch.Tensor, answers: object, eos: int) -> torch.Tensor:
        return torch.tensor([1.0, math.nan, 0.0, math.inf, 1.0, 0.0, -math.inf, 1.0])[: ids.shape[0]]

    worker = RolloutWorker(StubEngine(seed=0), unruly, group_size=4, eos_token_id=2, pad_token_id=0)
    problems = [Problem(i, f"{i}", "1", torch.tensor([1, 5 + i]), torch.tensor([7])) for i in range(2)]
    experiences = worker.generate_batch(problems, key="b0")
    assert [e.reward for e in experiences] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert [e.reward_flags["nonfinite"] for e in experiences] == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    buf = GroupAwareReplayBuffer(group_size=4)
    for e in experiences:
        buf.push(e)
    groups = buf.sample(2)
    assert len(groups) == 2 and all(math.isfinite(e.advantage) for g in groups for e in g)
    assert isinstance(experiences[0], Experience)
