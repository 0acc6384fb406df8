"""Checkpoint and restore of the in-process run: exact in sync and lagged, accounted in async."""

from __future__ import annotations

import io

import pytest
import torch

from tests.orchestration.test_orchestrator import build

DETERMINISTIC = ("loss/policy", "reward/mean", "staleness/mean", "staleness/max", "policy/clip_frac", "eval/accuracy")


def saved(orchestrator, after: int):  # type: ignore[no-untyped-def]
    """A run stopped after ``after`` steps: its checkpoint as it would be read from disk."""
    box: dict[str, bytes] = {}

    def after_step(done: int) -> None:
        if done == after:

            def write(state):  # type: ignore[no-untyped-def]
                buffer = io.BytesIO()
                torch.save(state, buffer)
                box["state"] = buffer.getvalue()

            orchestrator.checkpoint(write)
            raise KeyboardInterrupt  # killed right after the checkpoint

    with pytest.raises(KeyboardInterrupt):
        orchestrator.run(8, after_step=after_step)
    return torch.load(io.BytesIO(box["state"]), weights_only=True)


def curves(history):  # type: ignore[no-untyped-def]
    return [{k: s[k] for k in DETERMINISTIC if k in s} for s in history.steps]


@pytest.mark.parametrize(("mode", "kwargs"), [("sync", {}), ("lagged", {"lag": 2}), ("lagged", {"lag": 0})])
def test_a_resumed_run_repeats_the_uninterrupted_one_exactly(mode, kwargs):
    whole = build(mode, **kwargs)
    reference = whole.run(8)
    state = saved(build(mode, **kwargs), after=3)
    resumed = build(mode, **kwargs)
    resumed.restore(state)
    history = resumed.run(8)
    assert curves(history) == curves(reference) and len(history.steps) == 8
    assert history.staleness == reference.staleness and history.initial_metrics == reference.initial_metrics
    assert resumed.trainer.checksum() == whole.trainer.checksum()


def test_async_resume_loses_and_duplicates_nothing():
    state = saved(build("async", max_staleness=1), after=4)
    resumed = build("async", max_staleness=1)
    resumed.restore(state)
    history = resumed.run(8)
    stats = resumed.buffer.stats()
    assert len(history.steps) == 8 and stats["sampled"] == 8 * 16  # 8 steps × 16 experiences, none twice
    assert stats["pushed"] == stats["sampled"] + stats["dropped_overflow"] + stats["evicted_stale"] + stats["size"]
    assert max(tau for step in history.staleness for tau in step) <= 1


def test_restore_needs_a_fresh_orchestrator():
    orchestrator = build("sync")
    state = saved(build("sync"), after=2)
    orchestrator.run(2)
    with pytest.raises(RuntimeError, match="freshly built"):
        orchestrator.restore(state)
