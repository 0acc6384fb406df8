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

from pipelines.tracking.signals import (
    deferred_interrupts,
    exit_code,
    handling,
    held_back,
    shielded,
    sigterm_interrupts,
    stop_requested,
)

__all__ = [
    "InterruptedBeforeRun",
    "RunInterrupted",
    "deferred_interrupts",
    "end_group",
    "exit_code",
    "serve",
    "shielded",
    "sigterm_interrupts",
    "stop_on_signals",
    "stop_requested",
]


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
        name = signal.Signals(signum).name
        if requested and signum == signal.SIGINT and not held_back(name):
            raise KeyboardInterrupt(name)
        requested.append(name)

    with handling(handler):
        yield requested
