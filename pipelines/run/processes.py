"""Signals and child processes for the command line: a served UI that ends with its
workers, and SIGTERM handled like Ctrl-C where a command has no step boundary to stop at."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "InterruptedBeforeRun",
    "RunInterrupted",
    "deferred_interrupts",
    "end_group",
    "exit_code",
    "serve",
    "sigterm_interrupts",
    "stop_on_signals",
    "stop_requested",
]


_received: list[str] = []  # signals sigterm_interrupts caught in this process, while it is active
_held: list[str] | None = None  # inside deferred_interrupts: the signal it holds back, if any


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
        if _held == []:  # bookkeeping under way: raised when it is done
            _held.append(name)
            return
        raise KeyboardInterrupt(name)

    try:
        with _handling(handler):
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


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound now (another server holds it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def serve(command: list[str]) -> int:
    """Run the server in its own process group until it exits, or until a signal that
    ends a program here (SIGTERM, SIGINT, SIGHUP when the terminal goes, SIGQUIT), which
    ends the whole group, the server and its workers: 0 after Ctrl-C, else 128 + the
    signal's number (143 after SIGTERM, 129 after SIGHUP)."""
    server = subprocess.Popen(command, env=os.environ.copy(), start_new_session=True)
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        try:
            code = server.wait(timeout=None)
        except BaseException:
            stop(signal.SIGTERM, None)
            raise
        if stopped:
            end_group(server.pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not stopped:
        return code
    return 0 if stopped[0] == signal.SIGINT else 128 + stopped[0]


def end_group(pgid: int, grace_s: float = 10.0) -> None:
    """Wait for the process group's last members (workers that got the same SIGTERM),
    then kill what is left."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM, or a first Ctrl-C: the run stopped at a step boundary, checkpointed."""


class InterruptedBeforeRun(KeyboardInterrupt):
    """SIGTERM or Ctrl-C while building, before any MLflow run existed."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[str]]:
    """While inside, SIGTERM and a first SIGINT ask the run to stop after the current
    step (the list yielded gets the signal's name); a second SIGINT interrupts at once.
    Outside the main thread (a sweep trial's actor) signals are left alone."""
    requested: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum: int, frame: Any) -> None:
        if requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        requested.append(signal.Signals(signum).name)

    with _handling(handler):
        yield requested


@contextlib.contextmanager
def _handling(handler: Any) -> Iterator[None]:
    """``handler`` for SIGTERM and SIGINT while inside; the previous handlers after."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
