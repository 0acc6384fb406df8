"""Sweeps: grids and Optuna studies over experiment fields, trials in parallel on Ray.

The driver (this process) is the only writer of both stores:

* **Optuna** — every sweep is a study in SQLite (``optuna.db`` beside the MLflow
  database by default). A grid enqueues its combinations; an ``optuna`` sweep asks a
  seeded TPE sampler. Trials are driven ask-and-tell from the driver; each eval step's
  objective is reported as an intermediate value and the pruner (median by default)
  stops poor trials early. A sweep that is interrupted resumes where it stopped: finished
  trials (complete, pruned or failed) are kept and never rerun, and a trial cut off
  mid-run is marked failed (``interrupted``) and its parameters queued again.
* **Seeds** — a trial is one configuration. With ``seeds: [0, 1, 2]`` it runs once per
  seed and its value (what Optuna optimises and prunes on) is the seed mean; the
  summaries give mean, standard deviation, 95% confidence interval and n.
* **MLflow** — one parent run per sweep (reopened on resume), one nested child run per
  trial and seed with the full resolved spec as params and the swept values and seed as
  tags, its metrics streamed as it runs, and at the end a summary on the parent:
  configurations sorted by the objective (mean ± CI), the objective against each swept
  field with error bars, and for staleness sweeps the final objective against staleness
  with one line (and confidence band) per algorithm.

Each run is a Ray actor (sized by ``trial_resources``) running one local experiment;
the driver polls it for new metrics every ``poll_s`` and can ask it to stop. A run that
raises, or whose actor dies, fails its trial (its other seeds are stopped) and the
sweep goes on.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import itertools
import json
import math
import statistics
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
from pipelines.stats import SeedSummary, summarize
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
class _Config:
    """One Optuna trial: a configuration, run once per seed; its value is the seed mean."""

    trial: Any
    params: dict[str, Any]
    data: dict[str, Any]  # the experiment mapping: base + params
    pending: list[int]  # seeds not launched yet
    jobs: dict[int, _Job] = field(default_factory=dict)  # launched, by seed
    values: dict[int, float] = field(default_factory=dict)  # final objective by seed
    curves: dict[int, dict[int, float]] = field(default_factory=dict)  # step → seed → objective
    reported: set[int] = field(default_factory=set)
    error: str | None = None
    pruned: bool = False

    @property
    def stopping(self) -> bool:
        return self.pruned or self.error is not None

    @property
    def done(self) -> bool:
        return not self.pending and all(job.done for job in self.jobs.values())


@dataclass
class _Job:
    """One seed of a configuration, in its own actor, streaming to its own child run."""

    config: _Config
    seed: int
    actor: Any
    tracker: Tracker
    done: bool = False


def default_storage(tracking_uri: str) -> str:
    """``optuna.db`` beside a local MLflow SQLite store, else ``mlflow/optuna.db``."""
    if tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).parent / 'optuna.db'}"
    Path("mlflow").mkdir(exist_ok=True)
    return "sqlite:///mlflow/optuna.db"


def _sweep_hash(sweep: SweepSpec, base: dict[str, Any]) -> str:
    """What makes two calls the same study (the trial count may change)."""
    fixed = sweep.model_dump(mode="json", include={"method", "space", "objective", "direction", "seed", "seeds"})
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
        for run_id in _run_ids(frozen).values():
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

    A trial is one configuration; with ``sweep.seeds`` it runs once per seed (each seed
    its own actor and child run) and its value is the mean over seeds.

    Args:
        sweep: the sweep.
        base: its base experiment mapping (from :func:`~pipelines.spec.load_sweep`).
        max_trials: a budget of trials for this call (None: until the target).
        on_trial: called with each trial's summary row as it finishes.
        poll_s: how often running trials are polled for metrics.
    """
    import ray
    from mlflow import MlflowClient

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
    driver = _Driver(sweep, base, study, client, parent, max_trials, on_trial)
    try:
        driver.run(poll_s)
    except BaseException:
        driver.interrupt()
        _end_run(client, parent, "KILLED", "interrupted")
        raise
    rows = trial_rows(study, sweep)
    complete = len(_counted(study)) >= sweep.num_trials
    _summarise(client, parent, sweep, rows, complete)
    return SweepResult(parent, sweep.study_name, storage, rows, driver.started, uri, complete)


class _Driver:
    """Asks Optuna for configurations, runs each seed of each in an actor (at most
    ``sweep.parallel`` at once), streams their metrics to MLflow, reports the seed-mean
    objective to Optuna for pruning, and tells Optuna each configuration's result."""

    def __init__(
        self,
        sweep: SweepSpec,
        base: dict[str, Any],
        study: Any,
        client: Any,
        parent: str,
        max_trials: int | None,
        on_trial: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        import ray

        self.sweep, self.base, self.study, self.client, self.parent = sweep, base, study, client, parent
        self.max_trials, self.on_trial = max_trials, on_trial
        # No seeds axis: one run per configuration, at the base's own seed.
        self.seeds = list(sweep.seeds) if sweep.seeds else [spec_from_dict(copy.deepcopy(base)).seed]
        self.runner = ray.remote(max_concurrency=4, max_restarts=0)(TrialRunner)
        self.threads = max(1, int(sweep.trial_resources.num_cpus))
        self.configs: dict[int, _Config] = {}  # open trials, by number
        self.refs: dict[Any, _Job] = {}  # running jobs, by the ref of their result
        self.started = 0

    # ---------------------------------------------------------------- the loop
    def run(self, poll_s: float) -> None:
        import ray
        from ray.exceptions import RayActorError

        while True:
            self._fill()
            if not self.refs:
                return
            ready, _ = ray.wait(list(self.refs), num_returns=1, timeout=poll_s)
            for ref in ready:
                self._finish(ref, self.refs.pop(ref))
            for job in self.refs.values():
                with contextlib.suppress(RayActorError):  # its actor died: _finish records the failure
                    self._drain(job)

    def _remaining(self) -> int:
        left = self.sweep.num_trials - len(_counted(self.study)) - len(self.configs)
        return left if self.max_trials is None else min(left, self.max_trials - self.started)

    def _fill(self) -> None:
        """Start jobs until ``parallel`` run: open configurations' seeds first."""
        while len(self.refs) < self.sweep.parallel:
            config = next((c for c in self.configs.values() if c.pending and not c.stopping), None)
            if config is None:
                if self._remaining() <= 0:
                    return
                config = self._ask()
                if config is None:  # an invalid combination, already recorded
                    continue
            self._launch(config, config.pending.pop(0))

    # ---------------------------------------------------------------- trials
    def _ask(self) -> _Config | None:
        from optuna.trial import TrialState

        trial = self.study.ask()
        params = {key: _suggest(trial, key, values) for key, values in self.sweep.space.items()}
        self.started += 1
        data = copy.deepcopy(self.base)
        for key, value in params.items():
            set_path(data, key, value)
        try:
            spec_from_dict(self._job_data(data, trial.number, self.seeds[0]), source=f"trial {trial.number}")
        except SpecError as err:  # an invalid combination: a failed trial, the sweep goes on
            run_id = _invalid_trial_run(self.client, self.parent, self.sweep, trial.number, params, err)
            trial.set_user_attr("error", str(err))
            trial.set_user_attr("mlflow_run_ids", {str(self.seeds[0]): run_id})
            self.study.tell(trial, state=TrialState.FAIL)
            _report(self.on_trial, self.study, trial.number)
            return None
        config = _Config(trial, params, data, pending=list(self.seeds))
        self.configs[trial.number] = config
        return config

    def _job_data(self, data: dict[str, Any], number: int, seed: int) -> dict[str, Any]:
        data = copy.deepcopy(data)
        name = f"{self.sweep.name}-{number:03d}"
        if self.sweep.seeds:
            data["seed"] = seed
            name += f"-s{seed}"
        data["tracking"] = {**self.sweep.tracking.model_dump(), "run_name": name}
        return data

    def _launch(self, config: _Config, seed: int) -> None:
        number = config.trial.number
        spec = spec_from_dict(self._job_data(config.data, number, seed), source=f"trial {number}")
        tracker = Tracker(spec.tracking)
        tags = {"sweep.trial": str(number), "sweep.params": json.dumps(config.params), "sweep.name": self.sweep.name,
                "sweep.seed": str(spec.seed)}  # fmt: skip
        tracker.start(spec, parent_run_id=self.parent, tags=tags)
        actor = self.runner.options(
            num_cpus=self.sweep.trial_resources.num_cpus, num_gpus=self.sweep.trial_resources.num_gpus
        ).remote(self.threads)
        job = _Job(config, seed, actor, tracker)
        config.jobs[seed] = job
        config.trial.set_user_attr("mlflow_run_ids", {str(s): j.tracker.run_id for s, j in config.jobs.items()})
        self.refs[actor.run.remote(spec.model_dump(mode="json"))] = job

    def _drain(self, job: _Job) -> None:
        """Stream a job's new metrics to its child run; report seed means to Optuna."""
        import ray

        config = job.config
        for step, metrics in ray.get(job.actor.poll.remote()):
            job.tracker.on_metrics(step, metrics)
            value = metrics.get(self.sweep.objective)
            if value is None or not math.isfinite(value) or config.stopping:
                continue
            at_step = config.curves.setdefault(step, {})
            at_step[job.seed] = value
            if len(at_step) == len(self.seeds) and step not in config.reported:
                config.reported.add(step)
                config.trial.report(statistics.fmean(at_step.values()), step)
                if config.trial.should_prune():
                    config.pruned = True
                    self._stop(config)

    def _stop(self, config: _Config) -> None:
        """Pruned or failed: drop its unlaunched seeds, ask its running ones to stop."""
        config.pending.clear()
        for job in config.jobs.values():
            if not job.done:
                job.actor.stop.remote()

    def _finish(self, ref: Any, job: _Job) -> None:
        import ray

        config = job.config
        try:
            self._drain(job)
            out = ray.get(ref)
            if out["state"] == "pruned":  # it stopped when asked
                job.tracker.flush()
                _end_run(self.client, job.tracker.run_id, "KILLED", "pruned" if config.pruned else "stopped")
            else:
                value = out["final"].get(self.sweep.objective, math.nan)
                if not math.isfinite(value):
                    raise RuntimeError(f"objective {self.sweep.objective!r} was not logged (final value {value})")
                job.tracker.finish(out["history"])
                config.values[job.seed] = value
        except Exception as err:  # a failed seed fails its trial; the sweep goes on
            where = f"seed {job.seed}: " if self.sweep.seeds else ""
            config.error = config.error or f"{where}{type(err).__name__}: {err}"[:2000]
            job.tracker.fail(err)
            self._stop(config)
        finally:
            ray.kill(job.actor)
            job.done = True
        if config.done:
            self._tell(config)

    def _tell(self, config: _Config) -> None:
        from optuna.trial import TrialState

        trial = config.trial
        trial.set_user_attr("seed_values", {str(seed): value for seed, value in sorted(config.values.items())})
        if config.error is not None:
            trial.set_user_attr("error", config.error)
            self.study.tell(trial, state=TrialState.FAIL)
        elif config.pruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, statistics.fmean(config.values.values()))
        del self.configs[trial.number]
        _report(self.on_trial, self.study, trial.number)

    def interrupt(self) -> None:
        """Cut off: open trials failed as interrupted, their params queued again."""
        import ray
        from optuna.trial import TrialState

        for config in self.configs.values():
            for job in config.jobs.values():
                if not job.done:
                    ray.kill(job.actor)
                    _end_run(self.client, job.tracker.run_id, "KILLED", "interrupted")
            config.trial.set_user_attr(_INTERRUPTED, True)
            self.study.tell(config.trial, state=TrialState.FAIL)
            self.study.enqueue_trial(config.params)
        self.configs.clear()


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


def _run_ids(trial: Any) -> dict[str, str]:
    """The trial's child runs by seed."""
    return dict(trial.user_attrs.get("mlflow_run_ids", {}))


def _row(trial: Any) -> dict[str, Any]:
    """A trial's summary: its value is the seed mean, with std, 95% CI and n beside it."""
    duration = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
    values = {int(seed): value for seed, value in trial.user_attrs.get("seed_values", {}).items()}
    spread = summarize(list(values.values())) if values and trial.value is not None else None
    run_ids = _run_ids(trial)
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "std": spread.std if spread else None,
        "ci95": spread.ci95 if spread and spread.n > 1 else None,
        "n": spread.n if spread else 0,
        "seed_values": values,
        "params": dict(trial.params),
        "last_step": trial.last_step,
        "duration_s": duration,
        "run_id": next(iter(run_ids.values()), None),
        "run_ids": run_ids,
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
        _write_csv(folder / "trials.csv", sweep, rows)
        (folder / "trials.md").write_text(_markdown(sweep, rows))
        (folder / "trials.json").write_text(json.dumps(rows, indent=1, default=str))
        log_keys = {k for k, v in sweep.space.items() if not isinstance(v, list) and v.log}
        done = [r for r in rows if r["state"] == "COMPLETE"]
        title = f"{sweep.name}: {sweep.objective} per configuration"
        if sweep.seeds:
            title += f" (mean ± 95% CI over {len(sweep.seeds)} seeds)"
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
        if best["ci95"] is not None:
            metrics.append(Metric(f"best/{sweep.objective}_ci95", float(best["ci95"]), now, 0))
    tags = [RunTag("sweep.status", "complete" if complete else "partial"), RunTag("asyncrlhf.status", "finished")]
    if best is not None:
        tags += [RunTag("sweep.best_trial", str(best["number"])),
                 RunTag("sweep.best_params", json.dumps(best["params"]))]  # fmt: skip
    client.log_batch(parent, metrics=metrics, tags=tags, synchronous=True)
    client.set_terminated(parent, status="FINISHED")


def _write_csv(path: Path, sweep: SweepSpec, rows: list[dict[str, Any]]) -> None:
    keys = list(sweep.space)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["rank", "trial", "state", sweep.objective, "std", "ci95", "n", *keys, "seed_values",
                         "last_step", "duration_s", "run_ids"])  # fmt: skip
        for rank, r in enumerate(rows, 1):
            writer.writerow([rank, r["number"], r["state"], r["value"], r["std"], r["ci95"], r["n"],
                             *(r["params"].get(k) for k in keys), json.dumps(r["seed_values"]), r["last_step"],
                             r["duration_s"], json.dumps(r["run_ids"])])  # fmt: skip


def format_value(row: dict[str, Any]) -> str:
    """``mean ± ci95 (n=3)`` for seeded rows, the plain value otherwise, '' for none."""
    if row["value"] is None:
        return ""
    if row["ci95"] is None:
        return f"{row['value']:.4f}"
    return f"{row['value']:.4f} ± {row['ci95']:.4f} (n={row['n']})"


def _markdown(sweep: SweepSpec, rows: list[dict[str, Any]]) -> str:
    keys = list(sweep.space)
    seeded = bool(sweep.seeds)
    objective = f"{sweep.objective} (mean ± 95% CI)" if seeded else sweep.objective
    head = ["rank", "trial", "state", objective, *(["std", "per seed"] if seeded else []), *keys, "steps", "time (s)"]
    seeds = f" × seeds {sweep.seeds}" if seeded else ""
    lines = [f"# {sweep.name}: {len(rows)} trials{seeds}, {sweep.direction} {sweep.objective}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for rank, r in enumerate(rows, 1):
        spread = []
        if seeded:
            per_seed = ", ".join(f"{seed}: {value:.3f}" for seed, value in sorted(r["seed_values"].items()))
            spread = ["" if r["std"] is None else f"{r['std']:.4f}", per_seed]
        duration = "" if r["duration_s"] is None else f"{r['duration_s']:.0f}"
        cells = [rank, r["number"], r["state"], format_value(r), *spread, *(r["params"].get(k, "") for k in keys),
                 r["last_step"] if r["last_step"] is not None else "", duration]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def staleness_axes(sweep: SweepSpec) -> tuple[str, str | None] | None:
    """(staleness key, algorithm key or None) when the sweep varies staleness."""
    key = next((k for k in STALENESS_KEYS if k in sweep.space), None)
    if key is None:
        return None
    return key, "algorithm.name" if "algorithm.name" in sweep.space else None


def staleness_table(sweep: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, dict[Any, SeedSummary]]:
    """Objective of complete trials per algorithm and staleness value, summarised over
    every seed of every matching trial (mean, std, 95% CI, n)."""
    axes = staleness_axes(sweep)
    assert axes is not None, "not a staleness sweep"
    key, algo_key = axes
    cells: dict[str, dict[Any, list[float]]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            algo = str(r["params"].get(algo_key, "")) if algo_key else sweep.objective
            values = list(r["seed_values"].values()) or [r["value"]]
            cells.setdefault(algo, {}).setdefault(r["params"][key], []).extend(values)
    return {a: {k: summarize(v) for k, v in sorted(by_k.items())} for a, by_k in cells.items()}
