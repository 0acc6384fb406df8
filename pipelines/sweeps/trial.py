"""One run of a sweep: a Ray actor running an experiment, polled for its metrics."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch

from pipelines.spec import spec_from_dict
from pipelines.spec.files import SpecError

if TYPE_CHECKING:
    from pipelines.sweeps.spec import SweepSpec

__all__ = ["TrialRunner", "TrialStopped", "check_resources"]


class TrialStopped(Exception):
    """Raised inside a trial when the driver asks it to stop (pruning)."""


class TrialRunner:
    """A Ray actor running one experiment, polled by the driver for its metrics.

    Threaded (``max_concurrency`` > 1): ``run`` occupies one thread while ``poll`` and
    ``stop`` answer in others.
    """

    def __init__(self, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)
        self._lock = threading.Lock()
        self._pending: list[tuple[int, dict[str, float]]] = []
        self._tables: list[tuple[int, dict[str, list[Any]]]] = []
        self._stop = False

    def _on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self._pending.append((step, dict(metrics)))
            if self._stop:
                raise TrialStopped(f"stopped by the sweep at step {step}")

    def _on_table(self, step: int, rows: dict[str, list[Any]]) -> None:
        with self._lock:
            self._tables.append((step, rows))

    def run(self, spec_data: dict[str, Any], checkpoint_dir: str, restore: bool) -> dict[str, Any]:
        """Run the experiment, checkpointing into ``checkpoint_dir`` (continuing from its
        newest checkpoint with ``restore``)."""
        from pipelines.run import run_experiment

        spec = spec_from_dict(spec_data, source="trial")
        try:
            result = run_experiment(
                spec,
                on_metrics=self._on_metrics,
                track=False,
                checkpoint_dir=checkpoint_dir,
                restore=restore,
                on_table=self._on_table,
            )
        except TrialStopped:
            return {"state": "pruned"}
        return {"state": "complete", "history": result.history, "final": result.final_metrics}

    def poll(self) -> tuple[list[tuple[int, dict[str, float]]], list[tuple[int, dict[str, list[Any]]]]]:
        """New (step, metrics) and (step, evaluation table rows) since the last poll."""
        with self._lock:
            out, tables, self._pending, self._tables = self._pending, self._tables, [], []
        return out, tables

    def stop(self) -> None:
        with self._lock:
            self._stop = True


def check_resources(sweep: SweepSpec) -> None:
    """Refuse a sweep whose trials ask for more of a resource than the Ray cluster has."""
    import ray

    total = ray.cluster_resources()
    for resource, need in [("CPU", sweep.trial_resources.num_cpus), ("GPU", sweep.trial_resources.num_gpus)]:
        if need > total.get(resource, 0.0):
            raise SpecError(
                f"trial_resources.num_{resource.lower()}s={need:g} but the Ray cluster has "
                f"{total.get(resource, 0.0):g} {resource}s: no trial could start"
            )
