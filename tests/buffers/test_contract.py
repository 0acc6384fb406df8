"""The contract every replay buffer keeps; one subclass per implementation."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from asyncrlhf.buffers import BoundedReplayBuffer, GroupAwareReplayBuffer, ReplayBuffer, VersionedReplayBuffer
from asyncrlhf.orchestration import VersionManager
from asyncrlhf.types import Experience
from tests.buffers.helpers import make_exp


class BufferContract:
    """Subclasses say how to build the buffer and how its samples flatten."""

    group_size = 1

    def make(self, capacity: int) -> ReplayBuffer:
        raise NotImplementedError

    @staticmethod
    def flatten(sampled: list) -> list[Experience]:
        return sampled

    def units(self, n_experiences: int) -> int:
        """What ``sample`` counts in (experiences, or groups)."""
        return n_experiences // self.group_size

    def exps(self, n: int, start: int = 0) -> list[Experience]:
        # Consecutive experiences complete groups in order: prompt id = index // G.
        return [make_exp(prompt_id=(start + i) // self.group_size, reward=float(i % 2)) for i in range(n)]

    def test_is_a_replay_buffer(self):
        assert isinstance(self.make(8), ReplayBuffer)

    def test_fifo_order_and_removal(self):
        buf = self.make(64)
        items = self.exps(4 * self.group_size)
        for e in items:
            assert buf.push(e) is True
        first = self.flatten(buf.sample(self.units(2 * self.group_size)))
        rest = self.flatten(buf.sample(self.units(10 * self.group_size)))
        assert first + rest == items
        assert len(buf) == 0
        assert buf.sample(1) == []

    def test_sample_never_blocks_without_timeout(self):
        buf = self.make(8)
        start = time.monotonic()
        assert buf.sample(4) == []
        assert time.monotonic() - start < 0.5

    def test_sample_with_timeout_waits_for_producers(self):
        buf = self.make(64)
        items = self.exps(2 * self.group_size)

        def produce():
            for e in items:
                time.sleep(0.01)
                buf.push(e)

        thread = threading.Thread(target=produce)
        thread.start()
        got = self.flatten(buf.sample(self.units(len(items)), timeout=5.0))
        thread.join()
        assert got == items

    def test_sample_timeout_returns_what_is_there(self):
        buf = self.make(64)
        for e in self.exps(self.group_size):
            buf.push(e)
        start = time.monotonic()
        got = self.flatten(buf.sample(self.units(5 * self.group_size), timeout=0.1))
        assert len(got) == self.group_size
        assert 0.09 <= time.monotonic() - start < 2.0

    def test_close_wakes_waiting_consumers(self):
        buf = self.make(8)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(buf.sample(1, timeout=30.0)))
        thread.start()
        time.sleep(0.05)
        buf.close()
        thread.join(timeout=5.0)
        assert not thread.is_alive() and result == [[]]

    def test_batch_size_must_be_positive(self):
        with pytest.raises(ValueError, match="must be a positive integer"):
            self.make(8).sample(0)

    def test_push_rejects_non_experiences(self):
        with pytest.raises(TypeError, match="exp"):
            self.make(8).push({"reward": 1.0})

    def test_accounting_identity(self):
        buf = self.make(4 * self.group_size)
        for e in self.exps(10 * self.group_size):
            buf.push(e)
        buf.sample(self.units(3 * self.group_size))
        s = buf.stats()
        assert s["pushed"] == 10 * self.group_size
        assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)
        assert s["dropped_overflow"] == 6 * self.group_size

    def test_concurrent_stress_loses_and_duplicates_nothing(self):
        """4 producers, 2 consumers, 100k experiences; every one accounted for exactly once."""
        producers, per_producer = 4, 25_000
        buf = self.make(256 * self.group_size)
        seen: list[list[Experience]] = [[], []]
        done = threading.Event()

        def produce(p: int) -> None:
            for e in self.exps(per_producer, start=p * per_producer):
                buf.push(e)

        def consume(c: int) -> None:
            while True:
                got = buf.sample(self.units(32 * self.group_size), timeout=0.01)
                seen[c].extend(self.flatten(got))
                if not got and done.is_set():
                    break

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        consumers = [threading.Thread(target=consume, args=(c,)) for c in range(2)]
        for t in itertools.chain(threads, consumers):
            t.start()
        for t in threads:
            t.join()
        done.set()
        for t in consumers:
            t.join()
        sampled = seen[0] + seen[1]
        assert len({id(e) for e in sampled}) == len(sampled), "an experience was sampled twice"
        s = buf.stats()
        assert s["pushed"] == producers * per_producer
        assert s["sampled"] == len(sampled)
        assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buf)
        assert len(buf) == 0 or self.group_size > 1  # group leftovers may be incomplete
        assert s["sampled"] > 0


class TestBoundedContract(BufferContract):
    def make(self, capacity: int) -> BoundedReplayBuffer:
        return BoundedReplayBuffer(capacity)


class TestVersionedContract(BufferContract):
    def make(self, capacity: int) -> VersionedReplayBuffer:
        return VersionedReplayBuffer(capacity, max_staleness=2, version=VersionManager())


class TestGroupContract(BufferContract):
    group_size = 4

    def make(self, capacity: int) -> GroupAwareReplayBuffer:
        return GroupAwareReplayBuffer(self.group_size, max_groups=max(1, capacity // self.group_size))

    @staticmethod
    def flatten(sampled: list) -> list[Experience]:
        return [e for group in sampled for e in group]
