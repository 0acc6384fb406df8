"""What a run leaves behind: per-step metrics and a timeline of worker phases."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["IDLE_PHASES", "TIMING_METRICS", "RunHistory", "TimelineEvent", "bubble_fractions", "timing_dependent"]

# Phases in which a worker waits rather than computes.
IDLE_PHASES = frozenset({"wait"})

# Metrics that measure timing rather than learning: throughput and durations, and the
# buffer's backlog, which in the concurrent modes depends on how far the rollout side has
# run ahead. Everything else is bit-reproducible in ``sync`` and ``lagged`` for a seed.
TIMING_METRICS = ("perf/", "time/", "buffer/size")


def timing_dependent(name: str) -> bool:
    """Whether metric ``name`` measures timing (see :data:`TIMING_METRICS`)."""
    return name.startswith(TIMING_METRICS)


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One phase of one worker: wall-clock ``start``/``end`` (``time.time()``), and the CPU
    seconds of the thread that ran it (``cpu``, see :func:`asyncrlhf._clock.clock`; None
    where not measured)."""

    worker: str
    phase: str
    start: float
    end: float
    cpu: float | None = None


def bubble_fractions(events: list[TimelineEvent], start: float, end: float) -> dict[str, float]:
    """Idle share of ``[start, end]`` per worker: 1 − (busy time) / (wall time)."""
    wall = max(end - start, 1e-12)
    busy: dict[str, float] = defaultdict(float)
    for e in events:
        busy.setdefault(e.worker, 0.0)
        if e.phase not in IDLE_PHASES:
            busy[e.worker] += max(0.0, min(e.end, end) - max(e.start, start))
    return {worker: max(0.0, 1.0 - b / wall) for worker, b in busy.items()}


@dataclass
class RunHistory:
    """Per-step metrics (one dict per trainer step, in the shared vocabulary), the
    timeline, and the staleness of every trained experience."""

    mode: str
    steps: list[dict[str, float]] = field(default_factory=list)
    timeline: list[TimelineEvent] = field(default_factory=list)
    staleness: list[list[int]] = field(default_factory=list)
    initial_metrics: dict[str, float] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)

    def metric(self, name: str) -> list[tuple[int, float]]:
        """``(step, value)`` pairs of one metric, where it was logged."""
        return [(int(s["step"]), s[name]) for s in self.steps if name in s]

    def final(self) -> dict[str, float]:
        """The last logged value of every metric, plus the summary."""
        out: dict[str, float] = {}
        for s in self.steps:
            out.update(s)
        out.update(self.summary)
        return out
