"""Phase timing: wall-clock time for the timeline, thread CPU time beside it."""

from __future__ import annotations

import time

__all__ = ["clock"]


def clock() -> tuple[float, float]:
    """``(wall, this thread's CPU)`` now: a phase's start. Its event takes ``start[0]`` as
    the wall-clock start and ``time.thread_time() - start[1]`` as its CPU time, which a
    loaded machine does not inflate (another process taking the core stretches the wall
    time of whatever phase is running, not its CPU time)."""
    return time.time(), time.thread_time()
