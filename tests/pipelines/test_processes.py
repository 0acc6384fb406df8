"""Signals in the command line's processes: SIGTERM as Ctrl-C, and held back while
bookkeeping that must not be cut in two is under way."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipelines.run.processes import deferred_interrupts, sigterm_interrupts


def _signal_self(received: list[str], count: int) -> None:
    """SIGTERM to this process, then wait until its handler has run (it runs in the main
    thread at the interpreter's next check, not inside ``os.kill``)."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_signal_during_deferred_bookkeeping_is_raised_when_it_ends():
    steps: list[str] = []
    with sigterm_interrupts() as received:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"), deferred_interrupts():
            _signal_self(received, 1)
            steps.append("the write after the signal")  # not cut off
            with deferred_interrupts():  # nested: the outer block holds it
                steps.append("nested")
            steps.append("the last write")
        assert steps == ["the write after the signal", "nested", "the last write"]
        assert received == ["SIGTERM"]

        # a second signal while one is held raises at once: a stuck block can still be left
        with pytest.raises(KeyboardInterrupt), deferred_interrupts():
            _signal_self(received, 2)
            _signal_self(received, 3)
            steps.append("not reached")
        assert steps[-1] == "the last write"

        with pytest.raises(KeyboardInterrupt):  # outside a block: at once, as before
            _signal_self(received, 4)
            steps.append("not reached either")
        assert steps[-1] == "the last write"


def test_an_exception_inside_a_block_is_not_replaced_and_nothing_stays_held():
    with sigterm_interrupts() as received:
        with pytest.raises(ValueError), deferred_interrupts():
            raise ValueError("the block's own error")
        with deferred_interrupts():  # nothing held from before
            pass
        assert received == []
