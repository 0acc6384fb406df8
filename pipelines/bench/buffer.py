"""Buffer benchmark: push + sample throughput under 4 producers and 2 consumers.

    asyncrlhf bench --suite full --case buffer

Each buffer moves the same number of experiences through 4 producer and 2 consumer
threads; the baseline is a plain ``collections.deque`` behind one lock (no staleness,
no accounting, no waiting). The figure is throughput relative to that baseline, and
the accounting identity is checked after every run.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from asyncrlhf.buffers import BoundedReplayBuffer, GroupAwareReplayBuffer, VersionedReplayBuffer
from asyncrlhf.orchestration import VersionManager
from asyncrlhf.types import Experience
from pipelines.bench._timing import summarize

PRODUCERS, CONSUMERS = 4, 2


class _DequeBaseline:
    """The simplest thread-safe FIFO: what the buffers are measured against."""

    def __init__(self) -> None:
        self.items: deque[Experience] = deque()
        self.lock = threading.Lock()

    def push(self, exp: Experience) -> bool:
        with self.lock:
            self.items.append(exp)
        return True

    def sample(self, n: int, timeout: float | None = None) -> list[Experience]:
        with self.lock:
            return [self.items.popleft() for _ in range(min(n, len(self.items)))]


def _experiences(count: int, group_size: int) -> list[Experience]:
    prompt, response, logprobs = torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([-0.5])
    return [Experience(prompt, response, logprobs, float(i % 2), 0, i // group_size) for i in range(count)]


def _throughput(buffer, items: list[Experience], batch: int, flatten: bool) -> float:  # type: ignore[no-untyped-def]
    per = len(items) // PRODUCERS
    received = [0] * CONSUMERS
    done = threading.Event()

    def produce(p: int) -> None:
        for exp in items[p * per : (p + 1) * per]:
            buffer.push(exp)

    def consume(c: int) -> None:
        while True:
            got = buffer.sample(batch)
            received[c] += sum(len(g) for g in got) if flatten else len(got)
            if not got:
                if done.is_set():
                    return
                time.sleep(0.0001)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    consumers = [threading.Thread(target=consume, args=(c,)) for c in range(CONSUMERS)]
    start = time.perf_counter()
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    done.set()
    for t in consumers:
        t.join()
    elapsed = time.perf_counter() - start
    if hasattr(buffer, "stats"):
        s = buffer.stats()
        assert s["pushed"] == s["sampled"] + s["dropped_overflow"] + s["evicted_stale"] + len(buffer), s
        assert s["sampled"] == sum(received), (s, received)
    return PRODUCERS * per / elapsed


def run(items: int = 200_000, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Throughput of each buffer relative to the deque baseline, per repeat."""
    group = 8
    experiences = _experiences(items, group)
    capacity = items  # large enough that overflow does not decide the figure
    factories = {
        "deque": lambda: (_DequeBaseline(), 64, False),
        "bounded": lambda: (BoundedReplayBuffer(capacity), 64, False),
        "versioned": lambda: (VersionedReplayBuffer(capacity, 4, VersionManager()), 64, False),
        "group": lambda: (GroupAwareReplayBuffer(group, max_groups=capacity // group), 8, True),
    }
    ratios: dict[str, list[float]] = {name: [] for name in factories if name != "deque"}
    for _ in range(repeats):  # interleaved, so load drift affects each alike
        buffer, batch, flatten = factories["deque"]()
        base = _throughput(buffer, experiences, batch, flatten)
        for name in ratios:
            buffer, batch, flatten = factories[name]()
            ratios[name].append(_throughput(buffer, experiences, batch, flatten) / base)
    return {name: summarize(v) for name, v in ratios.items()}
