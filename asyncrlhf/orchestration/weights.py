"""Published weight snapshots: how new policies reach rollout engines.

The trainer publishes ``(version, weights, checksum)`` after its steps; rollout workers
take the version the schedule allows — an exact version (``sync``/``lagged``) or the
newest one at or above a floor (``async``) — and verify the checksum after loading. A
ring keeps the last ``keep`` versions (``Schedule.keep``) so a lagged worker finds the
exact snapshot it needs. In process the weights are tensors; on Ray the driver keeps the
same ring of object references.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from asyncrlhf._checks import check_positive_int
from asyncrlhf.models import weights_checksum

__all__ = ["Snapshot", "WeightStore", "WeightStoreClosed"]


class WeightStoreClosed(RuntimeError):
    """The run ended while a worker was waiting for weights."""


class Snapshot:
    """One published version. The checksum is computed on first use, by whoever
    verifies a load (off the trainer's critical path), and then cached."""

    def __init__(self, version: int, weights: Mapping[str, torch.Tensor], checksum: str | None = None) -> None:
        self.version = version
        self.weights = weights
        self._checksum = checksum
        self._lock = threading.Lock()

    @property
    def checksum(self) -> str:
        with self._lock:
            if self._checksum is None:
                self._checksum = weights_checksum(self.weights)
            return self._checksum


class WeightStore:
    """Thread-safe ring of the last ``keep`` published weight snapshots."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = check_positive_int("keep", keep)
        self._snapshots: OrderedDict[int, Snapshot] = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False

    def publish(self, version: int, weights: Mapping[str, torch.Tensor], checksum: str | None = None) -> None:
        """Add a snapshot (``weights`` must be a copy the publisher no longer mutates);
        ``checksum`` is computed lazily from ``weights`` when not given."""
        with self._cond:
            if self._snapshots and version <= next(reversed(self._snapshots)):
                raise ValueError(f"version {version} is not newer than the latest published one")
            self._snapshots[version] = Snapshot(version, weights, checksum)
            while len(self._snapshots) > self.keep:
                self._snapshots.popitem(last=False)
            self._cond.notify_all()

    def find(self, version: int, exact: bool) -> Snapshot | None:
        """Without waiting: the snapshot of exactly ``version`` (``exact``) or the newest
        one if it is at least ``version``; None when not published yet.

        Raises:
            KeyError: ``exact`` and ``version`` already left the ring.
        """
        with self._cond:
            return self._find(version, exact)

    def wait(self, version: int, exact: bool, timeout: float | None = None) -> Snapshot:
        """As :meth:`find`, waiting until the snapshot is published."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (snap := self._find(version, exact)) is None:
                if self._closed:
                    raise WeightStoreClosed(f"weight store closed while waiting for version {version}")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no weights of version {'=' if exact else '>='}{version} within {timeout}s")
                self._cond.wait(remaining)
            return snap

    def state_dict(self) -> list[tuple[int, Any, str]]:
        """The ring, oldest first: ``(version, weights, checksum)`` (for checkpoints)."""
        with self._cond:
            return [(s.version, s.weights, s.checksum) for s in self._snapshots.values()]

    def load_state_dict(self, ring: list[tuple[int, Any, str]]) -> None:
        """Refill an empty ring from :meth:`state_dict`."""
        with self._cond:
            if self._snapshots:
                raise RuntimeError("load_state_dict needs an empty weight store")
            for version, weights, checksum in ring:
                self._snapshots[int(version)] = Snapshot(int(version), weights, checksum)

    @property
    def versions(self) -> list[int]:
        with self._cond:
            return list(self._snapshots)

    def close(self) -> None:
        """Wake every waiter with WeightStoreClosed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _find(self, version: int, exact: bool) -> Snapshot | None:
        if not self._snapshots:
            return None
        if exact:
            oldest = next(iter(self._snapshots))
            if version < oldest:
                raise KeyError(f"version {version} left the ring (keep={self.keep}); oldest is {oldest}")
            return self._snapshots.get(version)
        newest = self._snapshots[next(reversed(self._snapshots))]
        return newest if newest.version >= version else None
