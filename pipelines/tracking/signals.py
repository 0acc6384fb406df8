"""The process's signals while a command runs: SIGTERM raised as Ctrl-C, and store writes
that a signal must not cut in two.

Here, below the run and sweep layers, because the tracker's own bookkeeping (creating a
run and recording its id, ending it) is such a write: a Ctrl-C between MLflow creating a
run and the tracker learning its id left the run RUNNING with nothing to end it, and a
second Ctrl-C during the end of a run cut the write that marks it KILLED.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

__all__ = [
    "deferred_interrupts",
    "exit_code",
    "handling",
    "held_back",
    "shielded",
    "sigterm_interrupts",
    "stop_requested",
]


_received: list[str] = []  # signals sigterm_interrupts caught in this process, while it is active
_held: list[str] | None = None  # inside deferred_interrupts: the signal it holds back, if any
_hold_all = False  # inside shielded: every signal is held back, not only the first


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[list[str]]:
    """While inside, SIGTERM (and Ctrl-C) raise KeyboardInterrupt (``timeout``, ``docker
    stop``, Slurm and Kubernetes send SIGTERM), so one clean-up path serves both. The list
    yielded records the signal's name: libraries between the handler and the caller (Ray
    waits, for one) may re-raise a bare KeyboardInterrupt, so the exit code is taken from
    it, not from the exception.

    An exception raised by a signal handler is lost if it lands in a weakref callback or a
    ``__del__`` ("Exception ignored in…"); a loop that must stop on a signal also polls
    :func:`stop_requested`. Inside :func:`deferred_interrupts` the first signal waits for
    the block's end.
    """
    received: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        received.append(name)
        _received.append(name)
        if held_back(name):  # bookkeeping under way: raised when it is done
            return
        raise KeyboardInterrupt(name)

    try:
        with handling(handler):
            yield received
    finally:
        _received.clear()


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """While inside, the first SIGTERM or Ctrl-C that :func:`sigterm_interrupts` catches is
    held back and raised as KeyboardInterrupt when the block ends; a second one raises at
    once. For bookkeeping of several writes that a signal must not cut in two: a sweep
    enqueueing a grid point and counting it, a trial told to Optuna and its run ended in
    MLflow. A signal raised anywhere left the two stores disagreeing (the last CI: a grid
    point enqueued, not counted, then run twice, and another never). Nested blocks are one."""
    global _held
    if _held is not None:
        yield
        return
    _held = []
    try:
        yield
    finally:
        held, _held = _held, None
    if held:
        raise KeyboardInterrupt(held[0])


def stop_requested() -> str | None:
    """The signal :func:`sigterm_interrupts` caught, if any (its interrupt may have been lost)."""
    return _received[-1] if _received else None


def exit_code(received: list[str]) -> int:
    """143 after SIGTERM, else 130 (Ctrl-C)."""
    return 143 if "SIGTERM" in received else 130


def held_back(name: str) -> bool:
    """Whether a signal handler should hold ``name`` back (recorded, raised at the end of
    the bookkeeping under way) instead of raising now."""
    if _held is None or (_held and not _hold_all):
        return False
    _held.append(name)
    return True


@contextlib.contextmanager
def shielded(reraise: bool = True) -> Iterator[None]:
    """Like :func:`deferred_interrupts`, but every signal is held back, however many: for
    the writes that end a run (marking it KILLED, closing its actors), which a second
    Ctrl-C must not cut short. The interrupt is raised at the end unless the block is
    already ending by an exception (an interrupt itself, usually) or ``reraise`` is False
    (the process is already stopping)."""
    global _held, _hold_all
    if _held is not None and _hold_all:
        yield
        return
    outer, outer_all = _held, _hold_all
    _held, _hold_all = list(outer or []), True
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        held = _held
        _held, _hold_all = outer, outer_all
        if held and outer is not None and not outer:
            outer.append(held[0])  # an enclosing deferred_interrupts raises it
        elif held and reraise and not failed and outer is None:
            raise KeyboardInterrupt(held[0])


@contextlib.contextmanager
def handling(handler: Any) -> Iterator[None]:
    """``handler`` for SIGTERM and SIGINT while inside; the previous handlers after."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
