"""Bounded FIFO replay buffer, and its staleness-evicting variant."""

from __future__ import annotations

from collections import deque

from asyncrlhf._checks import check_positive_int
from asyncrlhf.buffers.base import LockedBuffer, StalenessRule
from asyncrlhf.types import Experience

__all__ = ["BoundedReplayBuffer", "VersionedReplayBuffer"]


class BoundedReplayBuffer(LockedBuffer):
    """Thread-safe FIFO of at most ``max_size`` experiences; overflow drops the oldest.

    ``sample(n)`` removes and returns up to ``n`` of the oldest experiences. It never
    blocks unless ``timeout`` is given, in which case it waits up to that many seconds
    for ``n`` to be available (returning what it has at the deadline, or on ``close``).
    """

    def __init__(self, max_size: int) -> None:
        super().__init__()
        self.max_size = check_positive_int("max_size", max_size)
        self._items: deque[Experience] = deque()

    def push(self, exp: Experience) -> bool:
        """Store ``exp``; True if it was accepted."""
        if not isinstance(exp, Experience):
            raise TypeError(f"exp must be an Experience, got {type(exp).__name__}")
        with self._cond:
            self._pushed += 1
            if not self._admit(exp):
                return False
            if len(self._items) >= self.max_size:
                self._items.popleft()
                self._dropped_overflow += 1
            self._items.append(exp)
            self._notify()
            return True

    def sample(self, batch_size: int, timeout: float | None = None) -> list[Experience]:
        """Remove and return up to ``batch_size`` of the oldest (still usable) experiences."""
        return self._wait_and_take(check_positive_int("batch_size", batch_size), timeout)

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def stats(self) -> dict[str, int]:
        """Counters; ``pushed == sampled + dropped_overflow + evicted_stale + size + held``
        (``held``: taken by a blocking sample still waiting for more; 0 when quiescent)."""
        with self._cond:
            return self._counters(len(self._items))

    # Hooks for subclasses; called with the lock held.
    def _admit(self, exp: Experience) -> bool:
        return True

    def _take(self, out: list[Experience], batch_size: int) -> None:
        while self._items and len(out) < batch_size:
            out.append(self._items.popleft())


class VersionedReplayBuffer(BoundedReplayBuffer):
    """A bounded FIFO that knows the policy version and refuses stale data.

    Staleness τ = current − exp.policy_version. ``push`` refuses τ > max_staleness;
    ``sample`` evicts experiences that went stale while waiting, so nothing returned
    is ever staler than the bound at the moment of sampling. Refused and evicted
    experiences are both counted in ``evicted_stale`` (refusals also in
    ``rejected_stale``), so the accounting identity covers every push.

    Args:
        max_size: capacity.
        max_staleness: the largest τ accepted (0 = on-policy only).
        version: a VersionManager, or a zero-arg callable giving the current version.
    """

    def __init__(self, max_size: int, max_staleness: int, version: object) -> None:
        super().__init__(max_size)
        self._rule = StalenessRule(max_staleness, version)
        self._rejected_stale = 0

    @property
    def max_staleness(self) -> int:
        return self._rule.max_staleness

    def stats(self) -> dict[str, int]:
        out = super().stats()
        with self._cond:
            out["rejected_stale"] = self._rejected_stale
        return out

    def _admit(self, exp: Experience) -> bool:
        if self._rule.too_stale(exp.policy_version, self._rule.current()):
            self._evicted_stale += 1
            self._rejected_stale += 1
            return False
        return True

    def _recheck(self, out: list[Experience]) -> None:
        current = self._rule.current()
        kept = [exp for exp in out if not self._rule.too_stale(exp.policy_version, current)]
        self._evicted_stale += len(out) - len(kept)
        out[:] = kept

    def _take(self, out: list[Experience], batch_size: int) -> None:
        current = self._rule.current()
        while self._items and len(out) < batch_size:
            exp = self._items.popleft()
            if self._rule.too_stale(exp.policy_version, current):
                self._evicted_stale += 1
            else:
                out.append(exp)
