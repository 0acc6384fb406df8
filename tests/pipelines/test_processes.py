"""Signals in the command line's processes: SIGTERM as Ctrl-C, and held back while
bookkeeping that must not be cut in two is under way."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipelines.run.processes import deferred_interrupts, shielded, sigterm_interrupts


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


def test_a_shielded_block_holds_every_signal_and_raises_one_at_its_end():
    """The writes that end a run (marked KILLED, a checkpoint, the runtime closed) are not
    cut short however many signals come; ``reraise=False`` drops them (already stopping)."""
    steps: list[str] = []
    with sigterm_interrupts() as received:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"), shielded():
            for count in (1, 2, 3):
                _signal_self(received, count)
                steps.append(f"write {count}")
        assert steps == ["write 1", "write 2", "write 3"]
        with shielded(reraise=False):
            _signal_self(received, 4)
            _signal_self(received, 5)
            steps.append("the run marked KILLED")
        assert steps[-1] == "the run marked KILLED" and len(received) == 5
        with pytest.raises(KeyboardInterrupt), deferred_interrupts():  # shielded inside deferred
            with shielded():
                _signal_self(received, 6)
                _signal_self(received, 7)
                steps.append("inner")
            steps.append("the enclosing block's last write")
        assert steps[-2:] == ["inner", "the enclosing block's last write"]
