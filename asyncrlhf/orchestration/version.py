"""The policy version counter shared by rollout, buffers and trainer."""

from __future__ import annotations

import threading

from asyncrlhf._checks import check_nonnegative_int

__all__ = ["VersionManager"]


class VersionManager:
    """Thread-safe policy version: bumped by the trainer after each optimiser step.

    Example:
        >>> vm = VersionManager()
        >>> vm.bump(), vm.version, vm.staleness(0)
        (1, 1, 1)
    """

    def __init__(self, initial: int = 0) -> None:
        self._version = check_nonnegative_int("initial", initial)
        self._changed = threading.Condition(threading.Lock())  # read on every buffer push

    @property
    def version(self) -> int:
        # Reading one int attribute is atomic in CPython: no lock, because buffers read
        # the version inside their own lock on every push, and nesting locks there makes
        # contention convoys under many threads.
        return self._version

    def __call__(self) -> int:
        """The current version: a VersionManager is also a zero-arg version source."""
        return self.version

    def bump(self) -> int:
        """Advance the version by one and wake every waiter; returns the new version."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()
            return self._version

    def restore(self, version: int) -> None:
        """Set the version when resuming from a checkpoint (never during a run)."""
        with self._changed:
            self._version = check_nonnegative_int("version", version)
            self._changed.notify_all()

    def staleness(self, version: int) -> int:
        """τ = current − ``version``: how many updates behind data of ``version`` is."""
        with self._changed:
            return self._version - version

    def __repr__(self) -> str:
        return f"VersionManager(version={self.version})"
