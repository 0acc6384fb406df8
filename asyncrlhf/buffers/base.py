"""What every replay buffer does, and how buffers learn the current policy version.

Buffers sit below orchestration in the layering, so they take the version as a
*source*: anything with a ``.version`` attribute (a ``VersionManager``) or a zero-arg
callable returning an int.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.types import Experience

__all__ = ["LockedBuffer", "ReplayBuffer", "StalenessRule", "version_reader"]


@runtime_checkable
class ReplayBuffer(Protocol):
    """A thread-safe store between rollout (``push``) and training (``sample``).

    Accounting identity, at every quiescent moment:
    ``pushed == sampled + dropped_overflow + evicted_stale + len(buffer)``. While a
    blocking ``sample`` waits for more, the experiences it already took are reported by
    ``stats()`` as ``held``; ``pushed == sampled + dropped_overflow + evicted_stale +
    size + held`` holds at every moment.
    """

    def push(self, exp: Experience) -> bool: ...

    def sample(self, batch_size: int, timeout: float | None = None) -> list[Any]: ...

    def __len__(self) -> int: ...

    def stats(self) -> dict[str, int]: ...


def version_reader(version: object) -> Callable[[], int]:
    """Turn a VersionManager-like object or a zero-arg callable into a version getter."""
    if hasattr(version, "version"):
        return lambda: version.version  # type: ignore[attr-defined]
    if callable(version):
        return version  # type: ignore[return-value]
    raise TypeError(
        f"version must be a VersionManager or a zero-arg callable returning an int, got {type(version).__name__}"
    )


class StalenessRule:
    """τ = current − policy_version; data with τ > max_staleness is refused or evicted."""

    def __init__(self, max_staleness: int, version: object) -> None:
        self.max_staleness = check_nonnegative_int("max_staleness", max_staleness)
        self.current = version_reader(version)

    def too_stale(self, policy_version: int, current: int) -> bool:
        return current - policy_version > self.max_staleness


class LockedBuffer:
    """The locking, waiting and counting every buffer shares.

    Subclasses hold their items and implement ``_take(out, n)`` (move up to n units
    into ``out``, counting what they evict), ``_units(out)`` (experiences in ``out``)
    and, with a staleness bound, ``_recheck(out)`` (evict what went stale in ``out``
    while the sampler waited); they call ``_wait_and_take`` from their public ``sample``.
    A blocking sample re-checks what it holds after every wait, so nothing it returns is
    staler than the bound at the moment it returns.
    """

    def __init__(self) -> None:
        # A plain Lock (Condition's default is an RLock): pushes are the hot path.
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # samplers blocked in wait(); pushes notify only when > 0
        self._closed = False
        self._pushed = 0
        self._sampled = 0
        self._dropped_overflow = 0
        self._evicted_stale = 0
        self._held = 0  # experiences taken by samples that are still waiting for more

    def close(self) -> None:
        """Wake every waiting ``sample``; later samples return what is left without waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait_and_take(self, n: int, timeout: float | None) -> list[Any]:
        """Up to ``n`` units, waiting up to ``timeout`` seconds for them (None: no wait;
        ``inf``: until they come or the buffer closes)."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):  # NaN fails >= too
            raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
        forever = timeout is not None and math.isinf(timeout)
        deadline = None if timeout is None or forever else time.monotonic() + timeout
        out: list[Any] = []
        with self._cond:
            while True:
                self._take(out, n)
                if len(out) >= n or timeout is None or self._closed:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                held = self._units(out)
                self._waiting += 1
                self._held += held
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
                    self._held -= held
                self._recheck(out)  # the version may have moved while waiting
            self._sampled += self._units(out)
        return out

    def _notify(self) -> None:
        """Wake waiting samplers after new data (call with the lock held)."""
        if self._waiting:
            self._cond.notify_all()

    def _counters(self, size: int) -> dict[str, int]:
        """The shared counters; call with the lock held."""
        return {
            "pushed": self._pushed,
            "sampled": self._sampled,
            "dropped_overflow": self._dropped_overflow,
            "evicted_stale": self._evicted_stale,
            "size": size,
            "held": self._held,
        }

    def _counter_state(self) -> dict[str, int]:
        """The accounting counters, for a checkpoint (call with the lock held)."""
        return {
            "pushed": self._pushed,
            "sampled": self._sampled,
            "dropped_overflow": self._dropped_overflow,
            "evicted_stale": self._evicted_stale,
        }

    def _restore_counters(self, counters: dict[str, int]) -> None:
        self._pushed, self._sampled = int(counters["pushed"]), int(counters["sampled"])
        self._dropped_overflow, self._evicted_stale = int(counters["dropped_overflow"]), int(counters["evicted_stale"])

    def _take(self, out: list[Any], n: int) -> None:
        raise NotImplementedError

    def _recheck(self, out: list[Any]) -> None:
        """Evict from ``out`` what went stale while waiting (no bound: nothing)."""

    def _units(self, out: list[Any]) -> int:
        return len(out)
