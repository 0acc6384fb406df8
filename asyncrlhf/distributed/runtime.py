"""Connecting to Ray: an existing cluster by address, or a local one started for the run."""

from __future__ import annotations

import logging
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
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
