"""Connecting to Ray: an existing cluster by address, or a local one started for the run."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray

__all__ = ["ray_runtime"]


@contextmanager
def ray_runtime(address: str | None = None, num_cpus: int | None = 2, num_gpus: int | None = None) -> Iterator[None]:
    """Make sure Ray is up for the body.

    * Ray already initialised in this process (a test fixture, a sweep driver): use it,
      leave it running.
    * ``address`` (``"auto"``, ``"ray://head:10001"``, ``"10.0.0.1:6379"``): connect to
      that cluster; disconnect afterwards (the cluster keeps running).
    * neither: start a local cluster of ``num_cpus`` CPUs without the dashboard, and shut
      it down afterwards.
    """
    if ray.is_initialized():
        yield
        return
    # ray.init replaces the driver's SIGTERM handler with one that exits at once
    # (SystemExit 15, mid-step, the run left unrecorded): the caller's handling is kept.
    on_sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        # A local cluster names this machine by its loopback address: Ray versions that
        # bind their servers to the node's address then listen on 127.0.0.1 only.
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, logging_level=logging.WARNING,
                 _node_ip_address="127.0.0.1")  # fmt: skip
    if on_sigterm is not None:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        ray.shutdown()
