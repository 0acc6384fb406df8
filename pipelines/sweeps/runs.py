"""A sweep's MLflow side: its parent run, the end of interrupted runs, the summary."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from pipelines.specfile import flatten
from pipelines.store import owner_tags
from pipelines.sweeps import study as studies
from pipelines.sweeps.curves import write_study_curves
from pipelines.sweeps.report import SweepReport
from pipelines.sweeps.spec import SweepSpec
from pipelines.tracking import end_run, new_run

__all__ = ["end_open_children", "interrupt", "interrupt_stale", "log_summary", "parent_run", "seed_key"]


def interrupt(study: Any, client: Any, number: int, params: dict[str, Any], run_ids: dict[str, str]) -> None:
    """The one interrupt path: the trial is failed and queued again, its unfinished runs
    KILLED and remembered, so the queued trial continues each from its last checkpoint."""
    studies.interrupt(study, number, params)
    resumable = dict(study.user_attrs.get("resumable", {}))
    for seed, run_id in run_ids.items():
        if client.get_run(run_id).info.status != "FINISHED":
            end_run(client, run_id, "KILLED", "interrupted")
            resumable[seed_key(params, int(seed))] = run_id
    study.set_user_attr("resumable", resumable)


def end_open_children(client: Any, parent: str) -> None:
    """KILL every child run of ``parent`` still RUNNING: one an interrupt caught while it
    was being created, before its trial knew it (the driver holds the study's lock, so
    every open child is its own)."""
    experiment = client.get_run(parent).info.experiment_id
    query = f"tags.mlflow.parentRunId = '{parent}' and attributes.status = 'RUNNING'"
    for run in client.search_runs([experiment], filter_string=query):
        end_run(client, run.info.run_id, "KILLED", "interrupted")


def interrupt_stale(study: Any, client: Any) -> None:
    """:func:`interrupt` each trial still RUNNING in the study, with the parameters Optuna
    fixed for it if it was cut off before suggesting them."""
    for trial in studies.stale_trials(study):
        interrupt(study, client, trial.number, studies.trial_params(trial), trial.user_attrs.get("mlflow_run_ids", {}))


def seed_key(params: dict[str, Any], seed: int) -> str:
    return json.dumps([params, seed], sort_keys=True)


def parent_run(client: Any, sweep: SweepSpec, study: Any, storage: str) -> str:
    """The sweep's parent run: created, or reopened (owned by this process) on resume."""
    from mlflow.entities import RunTag

    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if run_id is not None:
        try:
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in owner_tags().items()], synchronous=True)
            return run_id
        except Exception:  # the parent lives in another store: start a new one
            pass
    tags = {"sweep.name": sweep.name, "sweep.method": sweep.method, "sweep.objective": sweep.objective,
            "sweep.storage": storage, "asyncrlhf.status": "running", **sweep.tracking.tags}  # fmt: skip
    run_id = new_run(client, sweep.tracking.experiment, sweep.name, tags, flatten(sweep))
    study.set_user_attr("mlflow_parent_run_id", run_id)
    return run_id


def log_summary(client: Any, parent: str, report: SweepReport, complete: bool, resumed: int) -> None:
    """The report's files and plots, counts and the best configuration, on the parent."""
    from mlflow.entities import Metric

    sweep, rows = report.sweep, report.rows
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-sweep-") as tmp:
        report.write(Path(tmp))
        write_study_curves(client, report, Path(tmp))
        for path in sorted(Path(tmp).iterdir()):
            client.log_artifact(parent, str(path), "summary")
    now = int(time.time() * 1000)
    states = [r["state"] for r in rows]
    metrics = [Metric(f"sweep/{s.lower()}", float(states.count(s)), now, 0) for s in ("COMPLETE", "PRUNED", "FAIL")]
    metrics.append(Metric("sweep/resumed_runs", float(resumed), now, 0))
    tags = {"sweep.status": "complete" if complete else "partial"}
    best = next((r for r in rows if r["state"] == "COMPLETE"), None)
    if best is not None:
        name = "best/" + sweep.objective.replace("/", "_")  # one "best" chart section, not "best/eval"
        metrics.append(Metric(name, float(best["value"]), now, 0))
        if best["ci95"] is not None:
            metrics.append(Metric(f"{name}_ci95", float(best["ci95"]), now, 0))
        tags.update({"sweep.best_trial": str(best["number"]), "sweep.best_params": json.dumps(best["params"])})
    client.log_batch(parent, metrics=metrics, synchronous=True)
    if complete and best is None:  # every trial failed or was pruned: the sweep found nothing
        tags["sweep.status"] = "failed"
        end_run(client, parent, "FAILED", "failed", tags)
    else:
        end_run(client, parent, "FINISHED", "finished", tags)
