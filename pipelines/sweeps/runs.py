"""A sweep's MLflow side: its parent run, the end of interrupted runs, the summary."""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from pipelines.run.checkpoint_store import CheckpointError, Checkpoints, checkpoint_folder
from pipelines.spec.files import flatten
from pipelines.sweeps import study as studies
from pipelines.sweeps.curves import write_study_curves
from pipelines.sweeps.report import SweepReport
from pipelines.sweeps.spec import SweepSpec
from pipelines.tracking import Tracker, end_run, new_run
from pipelines.tracking.names import COLOR_TAG, run_name_for, save_view
from pipelines.tracking.store import owner_tags

__all__ = [
    "adopt_finished",
    "end_open_children",
    "hand_over",
    "interrupt",
    "interrupt_stale",
    "log_summary",
    "parent_run",
    "refuse_orphaned",
    "resume_run",
    "seed_key",
    "take",
]

RESUMABLE = "resumable"  # study attribute: seed key → run cut off unfinished, to continue from its checkpoint
FINISHED = "finished"  # study attribute: seed key → run that FINISHED in a trial cut off, to adopt
PARENT = "mlflow_parent_run_id"  # study attribute: the sweep's parent run


def interrupt(study: Any, client: Any, number: int, params: dict[str, Any], run_ids: dict[str, str]) -> None:
    """The one interrupt path: the trial is failed and queued again. Its unfinished runs
    are KILLED and remembered, so the queued trial continues each from its last
    checkpoint; its FINISHED runs (a stop between a seed's end and its trial's tell) are
    remembered too, so the queued trial adopts them instead of running them twice."""
    if not studies.interrupt(study, number, params):
        return  # told just before the stop: its runs belong to it
    resumable = dict(study.user_attrs.get(RESUMABLE, {}))
    finished = dict(study.user_attrs.get(FINISHED, {}))
    for seed, run_id in run_ids.items():
        key = seed_key(params, int(seed))
        if client.get_run(run_id).info.status == "FINISHED":
            finished[key] = run_id
        else:
            end_run(client, run_id, "KILLED", "interrupted")
            resumable[key] = run_id
    study.set_user_attr(RESUMABLE, resumable)
    study.set_user_attr(FINISHED, finished)


def take(study: Any, attr: str, params: dict[str, Any], seed: int) -> str | None:
    """Pop the run an interrupt left in study attribute ``attr`` for these parameters and seed."""
    runs = dict(study.user_attrs.get(attr, {}))
    run_id = runs.pop(seed_key(params, seed), None)
    if run_id is not None:
        study.set_user_attr(attr, runs)
    return run_id


def hand_over(client: Any, run_id: str, name: str, tags: dict[str, str]) -> None:
    """Give an earlier trial's run to the trial taking it over: its name and tags."""
    from mlflow.entities import RunTag

    client.update_run(run_id, name=name)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)


def resume_run(
    study: Any, client: Any, tracker: Tracker, params: dict[str, Any], seed: int, tags: dict[str, str]
) -> bool:
    """Reopen, under ``tracker``, the run an interrupt cut off for these parameters and
    seed, if it left a usable checkpoint; True when the trial continues it rather than
    starting anew."""
    run_id = take(study, RESUMABLE, params, seed)
    if run_id is None:
        return False
    try:
        state, manifest = Checkpoints(checkpoint_folder(tracker.uri, run_id)).load_latest()
    except CheckpointError:
        return False  # nothing was checkpointed: the trial starts over in a new run
    assert tracker.config.run_name is not None
    hand_over(client, run_id, tracker.config.run_name, tags)
    tracker.resume(run_id, manifest["step"], state["record"]["steps"])
    study.set_user_attr("resumed_runs", [*study.user_attrs.get("resumed_runs", []), run_id])
    return True


def adopt_finished(
    study: Any, client: Any, params: dict[str, Any], seed: int, objective: str, name: str, tags: dict[str, str]
) -> tuple[str, dict[int, float]] | None:
    """The FINISHED run an interrupt left for these parameters and seed, handed over to
    the trial adopting it: its id and its objective by step (the last is its value)."""
    run_id = take(study, FINISHED, params, seed)
    if run_id is None:
        return None
    curve = {m.step: m.value for m in client.get_metric_history(run_id, objective)}
    if not curve or not math.isfinite(curve[max(curve)]):
        return None  # cannot happen for a run the driver finished; run the seed again
    hand_over(client, run_id, name, tags)
    return run_id, curve


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

    run_id = study.user_attrs.get(PARENT)
    if run_id is not None:
        try:
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in owner_tags().items()], synchronous=True)
            if "error" in client.get_run(run_id).data.tags:  # why it stopped last time: no longer true
                client.delete_tag(run_id, "error")
            return run_id
        except Exception:  # the parent lives in another store: start a new one
            pass
    tags = {
        "sweep.name": sweep.name,
        "sweep.method": sweep.method,
        "sweep.objective": sweep.objective,
        "sweep.storage": storage,
        "asyncrlhf.status": "running",
        "mlflow.note.content": sweep.description or f"{sweep.method} sweep of {', '.join(sweep.space)}",
        COLOR_TAG: PARENT_COLOR,
        **sweep.tracking.tags,
    }
    run_id = new_run(client, sweep.tracking.experiment, sweep.name, tags, flatten(sweep))
    experiment_id = client.get_run(run_id).info.experiment_id
    save_view(client, experiment_id, sweep.objective, maximize=sweep.direction == "maximize")
    study.set_user_attr(PARENT, run_id)
    return run_id


def refuse_orphaned(client: Any, sweep: SweepSpec, storage: str) -> None:
    """A new study whose sweep already has a parent run with trials in MLflow lost its
    study store (``optuna.db`` deleted or moved): running it would repeat every trial
    under a second parent. Refused, naming both and what to do."""
    from pipelines.tracking.integrity import StoreError

    experiment = client.get_experiment_by_name(sweep.tracking.experiment)
    if experiment is None:
        return
    parents = client.search_runs([experiment.experiment_id], filter_string="tags.`sweep.method` != ''")
    for parent in parents:  # compared here: a name or path may hold a quote the filter cannot
        if (parent.data.tags.get("sweep.name"), parent.data.tags.get("sweep.storage")) != (sweep.name, storage):
            continue
        children = client.search_runs(
            [experiment.experiment_id], max_results=1, filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
        if children:
            raise StoreError(
                f"sweep {sweep.name!r} has no study in {storage}, but MLflow run {parent.info.run_id} "
                "is its parent, with trials (was the study's database deleted or moved?): restore it, "
                f"or give the sweep a new name (--set name={sweep.name}-2) to start over"
            )


PARENT_COLOR = "#24292f"  # a sweep's parent run: near black, a colour no configuration gets


def config_label(sweep: SweepSpec, params: dict[str, Any]) -> str:
    """A trial's configuration as its runs' name reads it, seeds aside: ``lag=16·m2po``."""
    return run_name_for(sweep.name, params, limit=None)


def config_metrics(sweep: SweepSpec, rows: list[dict[str, Any]], now: int) -> list[Any]:
    """Per completed configuration ``summary/<config>/mean``, ``…/ci95`` (with two seeds or
    more) and ``…/n``: sortable and chartable in MLflow, as ``trials.csv`` has them.
    ``<config>`` is the trial's name in the characters a metric name may hold
    (``lag=16·m2po`` → ``lag_16 m2po``)."""
    from mlflow.entities import Metric

    out = []
    for row in rows:
        if row["state"] != "COMPLETE" or row["value"] is None:
            continue
        label = re.sub(r"[^\w.\- ]", "_", config_label(sweep, row["params"]).replace("·", " ").replace("=", "_"))
        figures = {"mean": row["value"], "ci95": row["ci95"], "n": row["n"] or 1}
        out += [Metric(f"summary/{label}/{k}", float(v), now, 0) for k, v in figures.items() if v is not None]
    return out


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
    summary = config_metrics(sweep, rows, now)
    metrics += summary
    means = [m.key for m in summary if m.key.endswith("/mean")]
    save_view(client, client.get_run(parent).info.experiment_id, sweep.objective, sweep.direction == "maximize", means)
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
