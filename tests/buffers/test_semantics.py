from __future__ import annotations

import threading

import pytest

from asyncrlhf.buffers import BoundedReplayBuffer, GroupAwareReplayBuffer, VersionedReplayBuffer
from asyncrlhf.orchestration import VersionManager
from tests.buffers.helpers import make_exp


def test_overflow_drops_the_oldest():
    buf = BoundedReplayBuffer(3)
    items = [make_exp(i) for i in range(5)]
    for e in items:
        buf.push(e)
    assert buf.sample(10) == items[2:]
    assert buf.stats()["dropped_overflow"] == 2


def test_staleness_boundary_is_exact():
    vm = VersionManager(initial=10)
    buf = VersionedReplayBuffer(16, max_staleness=3, version=vm)
    assert buf.push(make_exp(version=7)) is True  # τ = 3 = max_staleness: accepted
    assert buf.push(make_exp(version=6)) is False  # τ = 4: refused
    assert buf.push(make_exp(version=12)) is True  # from a newer policy: τ < 0 is fine
    s = buf.stats()
    assert (s["pushed"], s["evicted_stale"], s["rejected_stale"], len(buf)) == (3, 1, 1, 2)


def test_data_going_stale_while_waiting_is_evicted_at_sample_time():
    current = {"v": 0}
    buf = VersionedReplayBuffer(16, max_staleness=1, version=lambda: current["v"])
    old, fresh = make_exp(version=0), make_exp(version=1)
    buf.push(old)
    buf.push(fresh)
    current["v"] = 2  # old: τ = 2 > 1, fresh: τ = 1
    assert buf.sample(2) == [fresh]
    s = buf.stats()
    assert s["evicted_stale"] == 1 and s["rejected_stale"] == 0
    assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)


def test_negative_staleness_and_bad_version_source():
    with pytest.raises(ValueError, match="max_staleness"):
        VersionedReplayBuffer(4, max_staleness=-1, version=VersionManager())
    with pytest.raises(TypeError, match="version"):
        VersionedReplayBuffer(4, max_staleness=1, version=3)
    with pytest.raises(ValueError, match="max_size"):
        BoundedReplayBuffer(0)


@pytest.mark.parametrize("group_size", [0, -1])
def test_group_size_must_be_positive(group_size):
    with pytest.raises(ValueError, match="group_size"):
        GroupAwareReplayBuffer(group_size)


def test_group_buffer_needs_a_version_source_for_staleness():
    with pytest.raises(ValueError, match="version"):
        GroupAwareReplayBuffer(2, max_staleness=1)


def test_interleaved_prompts_complete_independently_with_advantages():
    buf = GroupAwareReplayBuffer(group_size=3)
    pushes = [("a", 1.0), ("b", 0.0), ("a", 0.0), ("c", 1.0), ("b", 0.0), ("a", 0.0), ("c", 1.0), ("b", 1.0)]
    for prompt, reward in pushes:
        buf.push(make_exp(prompt, reward=reward))
    assert buf.num_ready_groups == 2 and len(buf) == 8  # a, b ready; c pending (2)
    groups = buf.sample(5)
    assert [g[0].prompt_id for g in groups] == ["a", "b"]  # in order of completion
    a, b = groups
    # a: rewards [1, 0, 0] → μ = 1/3, σ = √2/3 → [√2, −1/√2, −1/√2]
    assert [e.advantage for e in a] == pytest.approx([2**0.5, -(2**-0.5), -(2**-0.5)], abs=1e-5)
    assert [e.advantage for e in b] == pytest.approx([-(2**-0.5), -(2**-0.5), 2**0.5], abs=1e-5)
    assert buf.stats()["pending"] == 2


def test_all_equal_group_gets_zero_advantages():
    buf = GroupAwareReplayBuffer(group_size=4)
    for _ in range(4):
        buf.push(make_exp("p", reward=0.7))
    (group,) = buf.sample(1)
    assert [e.advantage for e in group] == [0.0] * 4


def test_dr_grpo_advantages_are_unscaled():
    buf = GroupAwareReplayBuffer(group_size=2, advantage="dr_grpo")
    buf.push(make_exp("p", reward=1.0))
    buf.push(make_exp("p", reward=0.0))
    assert [e.advantage for e in buf.sample(1)[0]] == [0.5, -0.5]


def test_group_overflow_drops_the_oldest_group():
    buf = GroupAwareReplayBuffer(group_size=2, max_groups=2)
    for prompt in ["a", "a", "b", "b", "c", "c"]:
        buf.push(make_exp(prompt))
    assert [g[0].prompt_id for g in buf.sample(3)] == ["b", "c"]
    assert buf.stats()["dropped_overflow"] == 2


def test_group_staleness_evicts_whole_groups_pending_and_ready():
    vm = VersionManager()
    buf = GroupAwareReplayBuffer(group_size=2, max_staleness=1, version=vm)
    buf.push(make_exp("ready", version=0))
    buf.push(make_exp("ready", version=1))
    buf.push(make_exp("pending", version=0))
    vm.bump()
    vm.bump()  # version 2: anything from version 0 is now τ = 2 > 1
    assert buf.push(make_exp("late", version=0)) is False
    assert buf.sample(1) == []
    s = buf.stats()
    assert s["evicted_stale"] == 4 and len(buf) == 0
    assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)


def test_versioned_stress_with_a_moving_version():
    """4 producers tag with versions around the current one while a trainer bumps it.

    The trainer thread is the only one bumping, so for it the version it reads before
    sampling is the version at sampling time and the bound is checked exactly. The
    other consumer can only check what it can know: τ at sampling ≤ 2 implies
    policy_version ≥ (version read before sampling) − 2.
    """
    vm = VersionManager()
    buf = VersionedReplayBuffer(512, max_staleness=2, version=vm)
    sampled: list = [[], []]
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        for i in range(25_000):
            buf.push(make_exp(version=max(0, vm.version - 3 + i % 4)))

    def consume(index: int, bumps: bool) -> None:
        try:
            while not stop.is_set() or len(buf):
                before = vm.version
                got = buf.sample(64, timeout=0.01)
                if bumps:
                    assert all(vm.staleness(e.policy_version) <= 2 for e in got)
                    vm.bump()
                else:
                    assert all(e.policy_version >= before - 2 for e in got)
                sampled[index].extend(got)
        except BaseException as err:  # surface thread failures in the test
            errors.append(err)
            stop.set()

    producers = [threading.Thread(target=produce) for _ in range(4)]
    consumers = [threading.Thread(target=consume, args=(i, i == 0)) for i in range(2)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    stop.set()
    for t in consumers:
        t.join()
    assert not errors, errors
    got = sampled[0] + sampled[1]
    s = buf.stats()
    assert s["pushed"] == 100_000
    assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)
    assert s["sampled"] == len(got) == len({id(e) for e in got})
    assert s["evicted_stale"] > 0 and s["sampled"] > 0


@pytest.mark.parametrize("kind", ["versioned", "group"])
def test_a_blocked_sample_returns_nothing_that_went_stale_while_it_waited(kind):
    """Issue 16, item 11: with bound 1, a sample blocked holding version-0 experiences
    while the version moved to 3 used to return them at staleness 3."""
    current = {"v": 0}
    if kind == "versioned":
        buf = VersionedReplayBuffer(64, max_staleness=1, version=lambda: current["v"])
        push_group = lambda pid, v: buf.push(make_exp(pid, version=v))  # noqa: E731
        unit = 1
    else:
        buf = GroupAwareReplayBuffer(2, max_groups=32, max_staleness=1, version=lambda: current["v"])
        push_group = lambda pid, v: [buf.push(make_exp(pid, version=v)) for _ in range(2)]  # noqa: E731
        unit = 2
    got: list = []
    push_group("old-0", 0)
    push_group("old-1", 0)
    sampler = threading.Thread(target=lambda: got.extend(buf.sample(4, timeout=10.0)))
    sampler.start()
    while buf.stats()["held"] != 2 * unit:  # it took both and waits for two more
        pass
    s = buf.stats()  # consistent while it waits: the two it holds are "held"
    assert (s["pushed"], s["size"], s["held"], s["sampled"]) == (2 * unit, 0, 2 * unit, 0)
    current["v"] = 3
    for i in range(4):
        push_group(f"new-{i}", 3)
    sampler.join(timeout=10.0)
    flat = [e for item in got for e in (item if isinstance(item, list) else [item])]
    assert len(got) == 4 and max(current["v"] - e.policy_version for e in flat) == 0
    s = buf.stats()
    assert s["evicted_stale"] == 2 * unit and s["held"] == 0
    assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + s["size"] + s["held"]
