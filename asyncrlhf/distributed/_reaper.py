"""Ends a local Ray cluster's processes when the driver that started it dies.

Run as a script (``python _reaper.py DRIVER_PID``, so nothing of the package, torch
included, is imported), with its stdin a pipe the driver holds open and never writes.
Ray fate-shares most of its processes with the driver, but its dashboard and runtime-env
agents notice the raylet's death and then try to tell the (dead) GCS, for up to 60 s,
before they exit: after a SIGKILL of the driver they outlived it by a minute. This
process keeps a list of the driver's descendants, refreshed every half second, and
when the pipe closes without the driver saying it shut Ray down (``q``: it was killed,
or exited without leaving the runtime) kills those still running.
"""

from __future__ import annotations

import os
import select
import signal
import sys

import psutil

POLL_S = 0.5
QUIT = b"q"  # what the driver writes when it shut Ray down itself


def _descendants(driver: psutil.Process) -> dict[int, float]:
    """``pid → create time`` of the driver's descendants (but this process)."""
    out, me = {}, os.getpid()
    for child in driver.children(recursive=True):
        try:
            if child.pid != me:
                out[child.pid] = child.create_time()
        except psutil.Error:
            continue
    return out


def _kill(known: dict[int, float]) -> None:
    for pid, created in known.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                process.kill()
        except psutil.Error:
            continue


def main(driver_pid: int) -> None:
    # A Ctrl-C or SIGTERM to the whole process group is for the driver: this process
    # ends when the driver does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    known: dict[int, float] = {}
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready:
            if sys.stdin.buffer.read1(1) == QUIT:  # the driver shut Ray down itself: nothing to do
                return
            break  # EOF: the driver died with the cluster up
        if not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE:
            break  # gone, though a process it forked holds the pipe open
        try:
            known.update(_descendants(driver))
        except psutil.Error:
            break
    _kill(known)


if __name__ == "__main__":
    main(int(sys.argv[1]))
