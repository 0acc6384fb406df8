"""Running a sweep: :func:`run_sweep` takes the study's driver lock, checks both stores,
starts Ray, and drives the study (:class:`~pipelines.sweeps.driver.Driver`) to its
report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.run.processes import shielded
from pipelines.sweeps import runs as sweep_runs
from pipelines.sweeps import study as studies
from pipelines.sweeps.driver import Driver
from pipelines.sweeps.report import SweepReport, trial_rows
from pipelines.sweeps.spec import SweepSpec
from pipelines.sweeps.trial import check_resources
from pipelines.tracking import end_run, open_store, resolve_tracking_uri

__all__ = ["SweepResult", "run_sweep"]


@dataclass
class SweepResult:
    """What a sweep call returns: the study's trials (this call's and earlier ones)."""

    parent_run_id: str
    study_name: str
    storage: str
    report: SweepReport
    ran: int  # trials started by this call
    tracking_uri: str
    complete: bool

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.report.rows


def run_sweep(
    sweep: SweepSpec,
    base: dict[str, Any],
    max_trials: int | None = None,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 1.0,
) -> SweepResult:
    """Run (or resume) a sweep until it has ``sweep.num_trials`` finished trials, or this
    call has started ``max_trials``. Uses Ray if initialised (a test fixture), else starts
    one as ``sweep.runtime`` says; only one driver may run a study at a time.

    Args:
        sweep: the sweep.
        base: its base experiment mapping (from :func:`~pipelines.sweeps.load_sweep`).
        max_trials: a budget of trials for this call (None: until the target).
        on_trial: called with each trial's summary row as it finishes.
        poll_s: how often running trials are polled for metrics.
    """
    from asyncrlhf.distributed import ray_runtime

    uri = resolve_tracking_uri(sweep.tracking.uri)
    storage = sweep.storage or studies.default_storage(uri)
    with studies.driver_lock(storage, sweep.study_name):
        client = open_store(uri)  # both stores checked before Ray starts: a damaged one is one line
        study = studies.make_study(sweep, base, storage)
        if sweep_runs.PARENT not in study.user_attrs:
            sweep_runs.refuse_orphaned(client, sweep, storage)
        with ray_runtime(sweep.runtime.address, sweep.runtime.num_cpus):
            check_resources(sweep)
            sweep_runs.interrupt_stale(study, client)  # trials left RUNNING by a killed driver
            parent, driver = None, None
            try:
                with shielded():  # a signal while the parent is made waits: it is ended below
                    parent = sweep_runs.parent_run(client, sweep, study, storage)
                    sweep_runs.end_open_children(client, parent)  # and runs it was creating
                driver = Driver(sweep, base, study, client, parent, max_trials, on_trial)
                driver.run(poll_s)
            except BaseException:
                with shielded(reraise=False):  # no further signal cuts the clean-up short
                    if driver is not None:
                        driver.interrupt()
                    if parent is not None:
                        end_run(client, parent, "KILLED", "interrupted")
                raise
            assert parent is not None and driver is not None
            report = SweepReport(sweep, trial_rows(study, sweep))
            complete = len(studies.counted(study)) >= sweep.num_trials
            resumed = len(study.user_attrs.get("resumed_runs", []))
            sweep_runs.log_summary(client, parent, report, complete, resumed)
    return SweepResult(parent, sweep.study_name, storage, report, driver.started, uri, complete)
