"""What every replay buffer does, and how buffers learn the current policy version.

Buffers sit below orchestration in the layering, so they take the version as a
*source*: anything with a ``.version`` attribute (a ``VersionManager``) or a zero-arg
callable returning an int.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from asyncrlhf._checks import check_nonnegative_int
from asyncrlhf.types import Experience

__all__ = ["ReplayBuffer", "StalenessRule", "version_reader"]


@runtime_checkable
class ReplayBuffer(Protocol):
    """A thread-safe store between rollout (``push``) and training (``sample``).

    Accounting identity, at every quiescent moment:
    ``pushed == sampled + dropped_overflow + evicted_stale + len(buffer)``.
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
