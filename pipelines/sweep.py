"""Sweeps: grids and Optuna studies over experiment fields, trials in parallel on Ray.

The driver (this process) is the only writer of both stores:

* **Optuna** — every sweep is a study in SQLite (``optuna.db`` beside the MLflow
  database by default). A grid enqueues its combinations; an ``optuna`` sweep asks a
  seeded TPE sampler. Trials are driven ask-and-tell from the driver; each eval step's
  objective is reported as an intermediate value and the pruner (median by default)
  stops poor trials early. A sweep that is interrupted resumes where it stopped: finished
  trials (complete, pruned or failed) are kept and never rerun, and a trial cut off
  mid-run is marked failed (``interrupted``) and its parameters queued again.
* **MLflow** — one parent run per sweep (reopened on resume), one nested child run per
  trial with the full resolved spec as params and the swept values as tags, the trial's
  metrics streamed as it runs, and at the end a summary on the parent: trials sorted by
  the objective, the objective against each swept field, and for staleness sweeps the
  final objective against staleness with one line per algorithm.

Each trial is a Ray actor (sized by ``trial_resources``) running one local experiment;
the driver polls it for new metrics every ``poll_s`` and can ask it to stop. A trial
that raises, or whose actor dies, is recorded as failed and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import itertools
import json
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipelines.plots import plot_objective, plot_staleness
from pipelines.spec import SpecError, SweepSpec, TrackingSpec, flatten, set_path, spec_from_dict
from pipelines.tracking import Tracker, experiment_id_for, resolve_tracking_uri

__all__ = ["STALENESS_KEYS", "SweepResult", "TrialRunner", "default_storage", "run_sweep"]

STALENESS_KEYS = ("orchestrator.lag", "buffer.max_staleness")
_INTERRUPTED = "interrupted"


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
        self._stop = False

    def _on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self._pending.append((step, dict(metrics)))
            if self._stop:
                raise TrialStopped(f"stopped by the sweep at step {step}")

    def run(self, spec_data: dict[str, Any]) -> dict[str, Any]:
        from pipelines.run import run_experiment

        spec = spec_from_dict(spec_data, source="trial")
        try:
            result = run_experiment(spec, on_metrics=self._on_metrics, track=False)
        except TrialStopped:
            return {"state": "pruned"}
        return {"state": "complete", "history": result.history, "final": result.final_metrics}

    def poll(self) -> list[tuple[int, dict[str, float]]]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def stop(self) -> None:
        with self._lock:
            self._stop = True


@dataclass
class SweepResult:
    """What a sweep call returns: the study's trials (this call's and earlier ones)."""

    parent_run_id: str
    study_name: str
    storage: str
    rows: list[dict[str, Any]]
    ran: int  # trials started by this call
    tracking_uri: str
    complete: bool

    @property
    def best(self) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["state"] == "COMPLETE"), None)


@dataclass
class _Running:
    trial: Any
    actor: Any
    tracker: Tracker
    params: dict[str, Any]
    started: float = field(default_factory=time.time)
    stopping: bool = False


def default_storage(tracking_uri: str) -> str:
    """``optuna.db`` beside a local MLflow SQLite store, else ``mlflow/optuna.db``."""
    if tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).parent / 'optuna.db'}"
    Path("mlflow").mkdir(exist_ok=True)
    return "sqlite:///mlflow/optuna.db"


def _sweep_hash(sweep: SweepSpec, base: dict[str, Any]) -> str:
    """What makes two calls the same study (the trial count may change)."""
    fixed = sweep.model_dump(mode="json", include={"method", "space", "objective", "direction", "seed"})
    return hashlib.sha256(json.dumps([fixed, base], sort_keys=True).encode()).hexdigest()[:12]


def _suggest(trial: Any, key: str, values: Any) -> Any:
    if isinstance(values, list):
        return trial.suggest_categorical(key, values)
    if values.type == "int":
        step = int(values.step or 1)
        return trial.suggest_int(key, int(values.low), int(values.high), step=step, log=values.log)
    return trial.suggest_float(key, values.low, values.high, step=values.step, log=values.log)


def _make_study(sweep: SweepSpec, storage: str, signature: str) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if sweep.method == "grid":
        sampler: Any = optuna.samplers.RandomSampler(seed=sweep.seed)  # every grid trial is enqueued
    else:
        sampler = optuna.samplers.TPESampler(seed=sweep.seed, n_startup_trials=min(10, max(2, sweep.num_trials // 3)))
    if sweep.prunes:
        pruner: Any = optuna.pruners.MedianPruner(sweep.pruner.n_startup_trials, sweep.pruner.n_warmup_steps)
    else:
        pruner = optuna.pruners.NopPruner()
    study = optuna.create_study(
        storage=storage, study_name=sweep.study_name, sampler=sampler, pruner=pruner, direction=sweep.direction,
        load_if_exists=True,
    )  # fmt: skip
    known = study.user_attrs.get("sweep_hash")
    if known is None:
        study.set_user_attr("sweep_hash", signature)
    elif known != signature:
        raise SpecError(
            f"study {sweep.study_name!r} in {storage} was created by a different sweep (base, space, objective "
            "or method changed): give the sweep a new name, or delete the study to start over"
        )
    return study


def _recover(study: Any, client: Any) -> None:
    """Trials left RUNNING by a killed driver: failed (``interrupted``), queued again."""
    from optuna.trial import TrialState

    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(frozen._trial_id, _INTERRUPTED, True)
        study.tell(frozen.number, state=TrialState.FAIL)
        study.enqueue_trial(frozen.params)
        run_id = frozen.user_attrs.get("mlflow_run_id")
        if run_id is not None:
            _end_run(client, run_id, "KILLED", "interrupted")


def _end_run(client: Any, run_id: str, status: str, label: str) -> None:
    from mlflow.entities import RunTag

    try:
        client.log_batch(run_id, tags=[RunTag("asyncrlhf.status", label)], synchronous=True)
        client.set_terminated(run_id, status=status)
    except Exception:  # a run deleted from the store is nothing to end
        pass


def _counted(study: Any) -> list[Any]:
    """Finished trials that count toward the target (not those cut off by an interrupt)."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [t for t in study.get_trials(deepcopy=False, states=done) if not t.user_attrs.get(_INTERRUPTED)]


def _parent_run(client: Any, sweep: SweepSpec, study: Any, tracking: TrackingSpec, uri: str, storage: str) -> str:
    from mlflow.entities import Param, RunTag

    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if run_id is not None:
        try:
            client.update_run(run_id, status="RUNNING")
            return run_id
        except Exception:  # the parent lives in another store: start a new one
            pass
    experiment_id = experiment_id_for(client, tracking.experiment, uri)
    tags = {"sweep.name": sweep.name, "sweep.method": sweep.method, "sweep.objective": sweep.objective,
            "sweep.storage": storage, **tracking.tags}  # fmt: skip
    run = client.create_run(experiment_id, tags=tags, run_name=sweep.name)
    params = [Param(k, v[:6000]) for k, v in flatten(sweep).items()]
    for i in range(0, len(params), 100):
        client.log_batch(run.info.run_id, params=params[i : i + 100], synchronous=True)
    client.log_batch(run.info.run_id, tags=[RunTag("asyncrlhf.status", "running")], synchronous=True)
    study.set_user_attr("mlflow_parent_run_id", run.info.run_id)
    return run.info.run_id


def run_sweep(
    sweep: SweepSpec,
    base: dict[str, Any],
    max_trials: int | None = None,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 1.0,
) -> SweepResult:
    """Run (or resume) a sweep until it has ``sweep.num_trials`` finished trials, or this
    call has started ``max_trials``. Ray must be initialised (see ``ray_runtime``).

    Args:
        sweep: the sweep.
        base: its base experiment mapping (from :func:`~pipelines.spec.load_sweep`).
        max_trials: a budget of trials for this call (None: until the target).
        on_trial: called with each trial's summary row as it finishes.
        poll_s: how often running trials are polled for metrics.
    """
    import ray
    from mlflow import MlflowClient
    from optuna.trial import TrialState
    from ray.exceptions import RayActorError

    total = ray.cluster_resources()
    for resource, need in [("CPU", sweep.trial_resources.num_cpus), ("GPU", sweep.trial_resources.num_gpus)]:
        if need > total.get(resource, 0.0):
            raise SpecError(
                f"trial_resources.num_{resource.lower()}s={need:g} but the Ray cluster has "
                f"{total.get(resource, 0.0):g} {resource}s: no trial could start"
            )
    tracking = sweep.tracking
    uri = resolve_tracking_uri(tracking.uri)
    client = MlflowClient(tracking_uri=uri)
    storage = sweep.storage or default_storage(uri)
    study = _make_study(sweep, storage, _sweep_hash(sweep, base))
    _recover(study, client)
    if sweep.method == "grid":
        keys = list(sweep.space)
        for combo in itertools.islice(itertools.product(*sweep.space.values()), sweep.num_trials):
            study.enqueue_trial(dict(zip(keys, combo, strict=True)), skip_if_exists=True)
    parent = _parent_run(client, sweep, study, tracking, uri, storage)
    runner = ray.remote(max_concurrency=4, max_restarts=0)(TrialRunner)
    threads = max(1, int(sweep.trial_resources.num_cpus))
    running: dict[Any, _Running] = {}
    started = 0

    def remaining() -> int:
        left = sweep.num_trials - len(_counted(study)) - len(running)
        return left if max_trials is None else min(left, max_trials - started)

    def launch() -> None:
        nonlocal started
        trial = study.ask()
        params = {key: _suggest(trial, key, values) for key, values in sweep.space.items()}
        started += 1
        data = copy.deepcopy(base)
        for key, value in params.items():
            set_path(data, key, value)
        data["tracking"] = {**tracking.model_dump(), "run_name": f"{sweep.name}-{trial.number:03d}"}
        try:
            spec = spec_from_dict(data, source=f"trial {trial.number}")
        except SpecError as err:  # an invalid combination: a failed trial, the sweep goes on
            trial.set_user_attr("error", str(err))
            trial.set_user_attr("mlflow_run_id", _invalid_trial_run(client, parent, sweep, trial.number, params, err))
            study.tell(trial, state=TrialState.FAIL)
            _report(on_trial, study, trial.number)
            return
        tracker = Tracker(spec.tracking)
        tags = {"sweep.trial": str(trial.number), "sweep.params": json.dumps(params), "sweep.name": sweep.name}
        tracker.start(spec, parent_run_id=parent, tags=tags)
        trial.set_user_attr("mlflow_run_id", tracker.run_id)
        actor = runner.options(num_cpus=sweep.trial_resources.num_cpus, num_gpus=sweep.trial_resources.num_gpus).remote(
            threads
        )
        running[actor.run.remote(spec.model_dump(mode="json"))] = _Running(trial, actor, tracker, params)

    def drain(job: _Running) -> None:
        """Stream a trial's new metrics to its child run and its objective to Optuna."""
        for step, metrics in ray.get(job.actor.poll.remote()):
            job.tracker.on_metrics(step, metrics)
            value = metrics.get(sweep.objective)
            if value is not None and math.isfinite(value) and not job.stopping:
                job.trial.report(value, step)
                if job.trial.should_prune():
                    job.stopping = True
                    job.actor.stop.remote()

    def finish(ref: Any, job: _Running) -> None:
        try:
            drain(job)
            out = ray.get(ref)
            if out["state"] == "pruned":
                job.tracker.flush()
                _end_run(client, job.tracker.run_id, "KILLED", "pruned")
                study.tell(job.trial, state=TrialState.PRUNED)
            else:
                value = out["final"].get(sweep.objective, math.nan)
                if not math.isfinite(value):
                    raise RuntimeError(f"objective {sweep.objective!r} was not logged (final value {value})")
                job.tracker.finish(out["history"])
                study.tell(job.trial, value)
        except Exception as err:  # a failed trial is recorded, the sweep goes on
            job.trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:2000])
            job.tracker.fail(err)
            study.tell(job.trial, state=TrialState.FAIL)
        finally:
            ray.kill(job.actor)
        _report(on_trial, study, job.trial.number)

    try:
        while True:
            while len(running) < sweep.parallel and remaining() > 0:
                launch()
            if not running:
                break
            ready, _ = ray.wait(list(running), num_returns=1, timeout=poll_s)
            for ref in ready:
                finish(ref, running.pop(ref))
            for job in running.values():
                with contextlib.suppress(RayActorError):  # its actor died: finish() records the failure
                    drain(job)
    except BaseException:
        for job in running.values():  # cut off: failed as interrupted, their params queued again
            ray.kill(job.actor)
            study._storage.set_trial_user_attr(job.trial._trial_id, _INTERRUPTED, True)
            study.tell(job.trial, state=TrialState.FAIL)
            study.enqueue_trial(job.params)
            _end_run(client, job.tracker.run_id, "KILLED", "interrupted")
        _end_run(client, parent, "KILLED", "interrupted")
        raise
    rows = trial_rows(study, sweep)
    complete = len(_counted(study)) >= sweep.num_trials
    _summarise(client, parent, sweep, rows, complete)
    return SweepResult(parent, sweep.study_name, storage, rows, started, uri, complete)


def _invalid_trial_run(
    client: Any, parent: str, sweep: SweepSpec, number: int, params: dict[str, Any], err: Exception
) -> str:
    """A FAILED child run for a trial whose spec does not validate (nothing ran)."""
    from mlflow.entities import Param

    experiment_id = experiment_id_for(client, sweep.tracking.experiment, client.tracking_uri)
    tags = {"mlflow.parentRunId": parent, "sweep.trial": str(number), "sweep.params": json.dumps(params),
            "sweep.name": sweep.name, "error": str(err)[:4000]}  # fmt: skip
    run = client.create_run(experiment_id, tags=tags, run_name=f"{sweep.name}-{number:03d}")
    client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()], synchronous=True)
    _end_run(client, run.info.run_id, "FAILED", "failed")
    return run.info.run_id


def _report(on_trial: Callable[[dict[str, Any]], None] | None, study: Any, number: int) -> None:
    if on_trial is not None:
        on_trial(_row(study.trials[number]))


def _row(trial: Any) -> dict[str, Any]:
    duration = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": dict(trial.params),
        "last_step": trial.last_step,
        "duration_s": duration,
        "run_id": trial.user_attrs.get("mlflow_run_id"),
        "error": trial.user_attrs.get("error"),
    }


def trial_rows(study: Any, sweep: SweepSpec) -> list[dict[str, Any]]:
    """Counted trials, best first by the objective (trials without a value last)."""
    rows = [_row(t) for t in _counted(study)]
    sign = -1.0 if sweep.direction == "maximize" else 1.0
    return sorted(rows, key=lambda r: (r["value"] is None, sign * (r["value"] or 0.0), r["number"]))


# ------------------------------------------------------------------------- summary
def _summarise(client: Any, parent: str, sweep: SweepSpec, rows: list[dict[str, Any]], complete: bool) -> None:
    from mlflow.entities import Metric, RunTag

    keys = list(sweep.space)
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-sweep-") as tmp:
        folder = Path(tmp)
        with open(folder / "trials.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["rank", "trial", "state", sweep.objective, *keys, "last_step", "duration_s", "run_id"])
            for rank, r in enumerate(rows, 1):
                writer.writerow([rank, r["number"], r["state"], r["value"], *(r["params"].get(k) for k in keys),
                                 r["last_step"], r["duration_s"], r["run_id"]])  # fmt: skip
        (folder / "trials.md").write_text(_markdown(sweep, rows))
        (folder / "trials.json").write_text(json.dumps(rows, indent=1, default=str))
        log_keys = {k for k, v in sweep.space.items() if not isinstance(v, list) and v.log}
        done = [r for r in rows if r["state"] == "COMPLETE"]
        title = f"{sweep.name}: {sweep.objective} per trial"
        plot_objective(done, keys, sweep.objective, log_keys, title, folder / "objective_vs_params.png")
        axes = staleness_axes(sweep)
        if axes:
            table = staleness_table(sweep, rows)
            title = f"{sweep.name}: {sweep.objective} vs staleness"
            plot_staleness(table, axes[0], sweep.objective, title, folder / "objective_vs_staleness.png")
        for path in sorted(folder.iterdir()):
            client.log_artifact(parent, str(path), "summary")
    now = int(time.time() * 1000)
    states = [r["state"] for r in rows]
    metrics = [Metric(f"sweep/{s.lower()}", float(states.count(s)), now, 0) for s in ("COMPLETE", "PRUNED", "FAIL")]
    best = next((r for r in rows if r["state"] == "COMPLETE"), None)
    if best is not None:
        metrics.append(Metric(f"best/{sweep.objective}", float(best["value"]), now, 0))
    tags = [RunTag("sweep.status", "complete" if complete else "partial"), RunTag("asyncrlhf.status", "finished")]
    if best is not None:
        tags += [RunTag("sweep.best_trial", str(best["number"])),
                 RunTag("sweep.best_params", json.dumps(best["params"]))]  # fmt: skip
    client.log_batch(parent, metrics=metrics, tags=tags, synchronous=True)
    client.set_terminated(parent, status="FINISHED")


def _markdown(sweep: SweepSpec, rows: list[dict[str, Any]]) -> str:
    keys = list(sweep.space)
    head = ["rank", "trial", "state", sweep.objective, *keys, "steps", "time (s)"]
    lines = [f"# {sweep.name}: {len(rows)} trials, {sweep.direction} {sweep.objective}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for rank, r in enumerate(rows, 1):
        value = "" if r["value"] is None else f"{r['value']:.4f}"
        duration = "" if r["duration_s"] is None else f"{r['duration_s']:.0f}"
        cells = [rank, r["number"], r["state"], value, *(r["params"].get(k, "") for k in keys),
                 r["last_step"] if r["last_step"] is not None else "", duration]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def staleness_axes(sweep: SweepSpec) -> tuple[str, str | None] | None:
    """(staleness key, algorithm key or None) when the sweep varies staleness."""
    key = next((k for k in STALENESS_KEYS if k in sweep.space), None)
    if key is None:
        return None
    return key, "algorithm.name" if "algorithm.name" in sweep.space else None


def staleness_table(sweep: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, dict[Any, float]]:
    """Mean objective of complete trials per algorithm and staleness value."""
    axes = staleness_axes(sweep)
    assert axes is not None, "not a staleness sweep"
    key, algo_key = axes
    cells: dict[str, dict[Any, list[float]]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            algo = str(r["params"].get(algo_key, "")) if algo_key else sweep.objective
            cells.setdefault(algo, {}).setdefault(r["params"][key], []).append(r["value"])
    return {a: {k: sum(v) / len(v) for k, v in sorted(by_k.items())} for a, by_k in cells.items()}
