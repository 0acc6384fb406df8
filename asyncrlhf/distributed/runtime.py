"""Connecting to Ray: an existing cluster by address, or a local one started for the run."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
      it down afterwards; if this process dies first (SIGKILL), a small watcher process
      (``_reaper.py``) ends the cluster's processes, which would otherwise outlive it by
      up to a minute.
    """
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage data unless the user set it to 1
    # ray.init replaces the driver's SIGTERM handler with one that exits at once
    # (SystemExit 15, mid-step, the run left unrecorded): the caller's handling is kept.
    on_sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        # A local cluster names this machine by its loopback address: Ray versions that
        # bind their servers to the node's address then listen on 127.0.0.1 only.
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            _node_ip_address="127.0.0.1",
        )
    reaper = None if address else _start_reaper()
    if on_sigterm is not None:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        ray.shutdown()
        if reaper is not None:
            _stop_reaper(reaper)


def _start_reaper() -> subprocess.Popen[bytes] | None:
    """The process that ends this local cluster's processes if this one dies with it up
    (``_reaper.py``); None where it cannot start (no psutil)."""
    try:
        import psutil  # noqa: F401  (a dependency of Ray's; checked here, used by the script)
    except ImportError:
        return None
    script = Path(__file__).with_name("_reaper.py")
    try:
        return subprocess.Popen([sys.executable, str(script), str(os.getpid())], stdin=subprocess.PIPE)
    except OSError:
        return None


def _stop_reaper(reaper: subprocess.Popen[bytes]) -> None:
    assert reaper.stdin is not None
    try:
        reaper.stdin.write(b"q")  # _reaper.QUIT: Ray is down, nothing to kill
        reaper.stdin.close()
        reaper.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()
