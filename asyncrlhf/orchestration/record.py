"""The run's record, written the same way by every runtime: the timeline of every
worker's phases, each step's metrics (stamped with throughput and step time), streamed
to ``on_metrics`` as they come, and the run's summary."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from asyncrlhf.orchestration.evaluate import EvalCallback, Evaluation
from asyncrlhf.orchestration.history import RunHistory, TimelineEvent, bubble_fractions

__all__ = ["MetricsCallback", "StepRecorder"]

MetricsCallback = Callable[[int, dict[str, float]], None]


class StepRecorder:
    """The run's record, written the same way by every runtime.

    Times are wall-clock (``time.time()``), so events from several processes line up on
    one timeline. Thread-safe for :meth:`event`.
    """

    def __init__(self, mode: str, on_metrics: MetricsCallback | None = None, on_eval: EvalCallback | None = None):
        self.history = RunHistory(mode=mode)
        self.on_metrics, self.on_eval = on_metrics, on_eval
        self.samples = 0  # trained experiences
        self.tokens = 0  # generated response tokens
        self.t0 = time.time()
        self._last = self.t0
        self._elapsed = 0.0  # run time before a restore
        self._events: list[TimelineEvent] = []
        self._lock = threading.Lock()
        self._cpu0 = time.thread_time()

    def begin(self, keep_elapsed: bool = False) -> None:
        """Start the clock: throughput and bubbles are measured from here (after a
        restore, ``keep_elapsed`` continues the restored run's clock)."""
        now = time.time()
        self.t0, self._last = now - (self._elapsed if keep_elapsed else 0.0), now
        self._cpu0 = time.thread_time()  # the loop's own thread, for time/loop_cpu_s

    def event(self, worker: str, phase: str, start: float, end: float | None = None, cpu: float | None = None) -> None:
        with self._lock:
            self._events.append(TimelineEvent(worker, phase, start, time.time() if end is None else end, cpu))

    def initial(self, evaluation: Evaluation) -> None:
        """The evaluation before any update: kept, and reported at once as step 0."""
        metrics = {"eval/accuracy": evaluation.accuracy}
        self.history.initial_metrics.update(metrics)
        if self.on_metrics is not None:
            self.on_metrics(0, dict(metrics))
        if self.on_eval is not None:
            self.on_eval(0, evaluation)

    def step(
        self, metrics: dict[str, float], staleness: list[int], samples: int, evaluation: Evaluation | None = None
    ) -> None:
        """A trainer step finished: stamp its metrics, keep them, report them (and its
        evaluation's responses, if it evaluated)."""
        now = time.time()
        self.samples += samples
        step = len(self.history.steps) + 1
        metrics.update(
            {
                "step": float(step),
                "perf/samples_per_s": self.samples / (now - self.t0),
                "perf/gen_tokens_per_s": self.tokens / (now - self.t0),
                "time/step_s": now - self._last,
            }
        )
        self._last = now
        self.history.steps.append(metrics)
        self.history.staleness.append(staleness)
        if self.on_metrics is not None:
            self.on_metrics(step, metrics)
        if self.on_eval is not None and evaluation is not None:
            self.on_eval(step, evaluation)

    def state_dict(self) -> dict[str, Any]:
        """The record so far (for checkpoints): steps, staleness, events, counters, and
        the run time elapsed, so throughput continues across a resume."""
        with self._lock:
            events = [(e.worker, e.phase, e.start, e.end, e.cpu) for e in self._events]
        history = self.history
        return {
            "steps": [dict(s) for s in history.steps],
            "staleness": [list(s) for s in history.staleness],
            "initial_metrics": dict(history.initial_metrics),
            "events": events,
            "samples": self.samples,
            "tokens": self.tokens,
            "elapsed": time.time() - self.t0,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        history = self.history
        history.steps, history.staleness = [dict(s) for s in state["steps"]], [list(s) for s in state["staleness"]]
        history.initial_metrics = dict(state["initial_metrics"])
        with self._lock:
            self._events = [TimelineEvent(*e) for e in state["events"]]
        self.samples, self.tokens = int(state["samples"]), int(state["tokens"])
        self._elapsed = float(state["elapsed"])

    @property
    def steps_done(self) -> int:
        return len(self.history.steps)

    def finish(self, rollout_workers: list[str], extra: dict[str, float] | None = None) -> RunHistory:
        """The timeline and the summary; a worker with no event was idle throughout."""
        end = time.time()
        with self._lock:
            self.history.timeline = sorted(self._events, key=lambda e: e.start)
        bubbles = bubble_fractions(self.history.timeline, self.t0, end)
        rollout = [bubbles.get(name, 1.0) for name in rollout_workers]
        self.history.summary = {
            "perf/bubble_frac_rollout": sum(rollout) / len(rollout),
            "perf/bubble_frac_trainer": bubbles.get("trainer", 1.0),
            "perf/samples_per_s": self.samples / (end - self.t0),
            "perf/gen_tokens_per_s": self.tokens / (end - self.t0),
            "time/total_s": end - self.t0,
            # CPU seconds of the thread that ran the loop (begin to finish, this process):
            # in sync mode with one torch thread, the whole run's work
            "time/loop_cpu_s": time.thread_time() - self._cpu0,
            "weights/loads": float(sum(e.phase == "load_weights" for e in self.history.timeline)),
            **(extra or {}),
        }
        return self.history
