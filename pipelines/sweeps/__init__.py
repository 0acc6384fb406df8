"""Sweeps: grids and Optuna studies over experiment fields, trials in parallel on Ray.

* :mod:`~pipelines.sweeps.spec` — the sweep schema and ``load_sweep``.
* :mod:`~pipelines.sweeps.study` — the Optuna study (public API only): creation, grid
  enqueueing, suggestions, the one interrupt path, what counts.
* :mod:`~pipelines.sweeps.sweep` — ``run_sweep``: the lock, the stores, Ray, the report.
* :mod:`~pipelines.sweeps.driver` — runs configurations × seeds on Ray actors, streams
  them to MLflow, reports seed means to Optuna, logs the report on the parent run.
* :mod:`~pipelines.sweeps.report` — the one report (from ``study.trials_dataframe()``)
  behind the CLI's table and the parent run's tables and plots.
"""

from pipelines.sweeps.report import SweepReport, format_value, staleness_table, trial_rows
from pipelines.sweeps.spec import STALENESS_KEYS, SweepSpec, load_sweep, sweep_base
from pipelines.sweeps.study import default_storage
from pipelines.sweeps.sweep import SweepResult, run_sweep
from pipelines.sweeps.trial import TrialRunner

__all__ = [
    "STALENESS_KEYS",
    "SweepReport",
    "SweepResult",
    "SweepSpec",
    "TrialRunner",
    "default_storage",
    "format_value",
    "load_sweep",
    "run_sweep",
    "staleness_table",
    "sweep_base",
    "trial_rows",
]
