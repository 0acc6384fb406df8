"""The sweep driver: configurations from Optuna, runs on Ray actors, results into MLflow
(:func:`~pipelines.sweeps.sweep.run_sweep` starts it).

The driver (this process) is the only writer of both stores. A trial is one
configuration; with ``seeds: [0, 1, 2]`` it runs once per seed and its value (what
Optuna optimises and prunes on) is the seed mean. Each run is a Ray actor (sized by
``trial_resources``) running one local experiment; the driver polls it for new metrics
every ``poll_s``, streams them to the run's own MLflow child run, reports each eval
step's seed mean to Optuna once every seed has reached it, and stops the configuration
when the pruner says so. A run that raises, or whose actor dies, fails its trial (its
other seeds are stopped) and the sweep goes on.

MLflow: one parent run per sweep (reopened on resume), one nested child run per trial
and seed with the full resolved spec as params and the swept values and seed as tags,
and at the end the :class:`~pipelines.sweeps.report.SweepReport` on the parent.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.run.checkpoint_store import checkpoint_folder
from pipelines.run.processes import shielded, stop_requested
from pipelines.spec import spec_from_dict
from pipelines.spec.files import SpecError, set_path
from pipelines.sweeps import runs as sweep_runs
from pipelines.sweeps import study as studies
from pipelines.sweeps.report import trial_rows
from pipelines.sweeps.spec import SweepSpec, choice_value
from pipelines.sweeps.trial import TrialRunner
from pipelines.tracking import Tracker, end_run, new_run
from pipelines.tracking.names import run_name_for

__all__ = ["Driver"]


@dataclass
class _Config:
    """One Optuna trial: a configuration, run once per seed; its value is the seed mean."""

    trial: Any
    params: dict[str, Any]
    data: dict[str, Any]  # the experiment mapping: base + params
    pending: list[int]  # seeds not launched yet
    jobs: dict[int, _Job] = field(default_factory=dict)  # launched, by seed
    adopted: dict[int, str] = field(default_factory=dict)  # seed → run finished before an interrupt
    values: dict[int, float] = field(default_factory=dict)  # final objective by seed
    curves: dict[int, dict[int, float]] = field(default_factory=dict)  # step → seed → objective
    token_staleness: dict[int, float] = field(default_factory=dict)  # seed → mean staleness/token_mean
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


class Driver:
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
            signalled = stop_requested()
            if signalled is not None:  # its KeyboardInterrupt was swallowed (a weakref callback, a __del__)
                raise KeyboardInterrupt(signalled)
            # The driver's writes are shielded: a signal is taken only between them, polled
            # here or raised as they end, so Optuna and MLflow are never left half-told
            # (a grid point enqueued and not counted ran twice), however many signals come
            with shielded():
                self._fill()
                if not self.refs:
                    return
            ready, _ = ray.wait(list(self.refs), num_returns=1, timeout=poll_s)  # waits only: may be cut
            with shielded():
                for ref in ready:
                    self._finish(ref, self.refs.pop(ref))
                for job in self.refs.values():
                    with contextlib.suppress(RayActorError):  # its actor died: _finish records the failure
                        self._drain(job)

    def _remaining(self) -> int:
        left = self.sweep.num_trials - len(studies.counted(self.study)) - len(self.configs)
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
                if config.done:  # every seed adopted from runs an interrupt found finished
                    self._tell(config)
                    continue
            self._launch(config, config.pending[0])  # it leaves pending once registered

    def interrupt(self) -> None:
        """Cut off: open trials failed as interrupted, their params queued again; also a
        trial Optuna has opened but this driver not yet registered (cut off in ``ask``):
        this driver holds the study's lock, so every RUNNING trial is its own."""
        import ray

        running = {trial.number for trial in studies.stale_trials(self.study)}
        for config in list(self.configs.values()):
            if config.trial.number in running and config.done:  # every seed ended before the stop
                self._tell(config)
                continue
            for job in config.jobs.values():
                if not job.done:
                    ray.kill(job.actor)
            # Every seed's run not yet FINISHED (one cut off while being finished too).
            sweep_runs.interrupt(self.study, self.client, config.trial.number, config.params, self._run_ids(config))
        self.configs.clear()
        sweep_runs.interrupt_stale(self.study, self.client)
        sweep_runs.end_open_children(self.client, self.parent)

    # ---------------------------------------------------------------- trials
    def _ask(self) -> _Config | None:
        from optuna.trial import TrialState

        if self.sweep.method == "grid":
            studies.enqueue_grid_point(self.sweep, self.study)
        trial = self.study.ask()
        params = {key: studies.suggest(trial, key, values) for key, values in self.sweep.space.items()}
        self.started += 1
        data = copy.deepcopy(self.base)
        for key, value in params.items():
            set_path(data, key, choice_value(self.sweep.space[key], value))
        try:
            spec_from_dict(self._job_data(data, trial.number, self.seeds[0], params), source=f"trial {trial.number}")
        except SpecError as err:  # an invalid combination: a failed trial, the sweep goes on
            tags = {
                "mlflow.parentRunId": self.parent,
                "sweep.trial": str(trial.number),
                "error": str(err)[:4000],
                "sweep.params": json.dumps(params),
                "sweep.name": self.sweep.name,
            }
            name = self._name(trial.number, params)
            run_id = new_run(self.client, self.sweep.tracking.experiment, name, tags, params)
            end_run(self.client, run_id, "FAILED", "failed")
            trial.set_user_attr("error", str(err))
            trial.set_user_attr("mlflow_run_ids", {str(self.seeds[0]): run_id})
            self.study.tell(trial, state=TrialState.FAIL)
            self._report(trial.number)
            return None
        config = _Config(trial, params, data, pending=list(self.seeds))
        self.configs[trial.number] = config
        self._adopt(config)
        if config.adopted:  # launched seeds are recorded by _launch
            trial.set_user_attr("mlflow_run_ids", self._run_ids(config))
        return config

    def _adopt(self, config: _Config) -> None:
        """Take over the seeds' runs an interrupt found FINISHED: their values and curves."""
        number, params = config.trial.number, config.params
        for seed in list(config.pending):
            name, tags = self._name(number, params, seed), self._tags(number, params, seed)
            found = sweep_runs.adopt_finished(self.study, self.client, params, seed, self.sweep.objective, name, tags)
            if found is not None:
                config.pending.remove(seed)
                config.adopted[seed], curve = found
                config.values[seed] = curve[max(curve)]
                for step in filter(None, curve):  # step 0 is before training, as in _drain
                    config.curves.setdefault(step, {})[seed] = curve[step]

    def _name(self, number: int, params: dict[str, Any], seed: int | None = None) -> str:
        """``lr=1e-4·lag=2`` (and ``·s1`` per seed): the trial's swept values (its number is
        tag ``sweep.trial``); ``sweep-003`` for a trial that sweeps nothing."""
        seed = seed if self.sweep.seeds else None
        return run_name_for(f"{self.sweep.name}-{number:03d}", params, seed, limit=None)  # every swept value

    def _tags(self, number: int, params: dict[str, Any], seed: int) -> dict[str, str]:
        return {
            "sweep.trial": str(number),
            "sweep.params": json.dumps(params),
            "sweep.config": sweep_runs.config_label(self.sweep, params),  # Group by: readable group names
            "sweep.name": self.sweep.name,
            "sweep.seed": str(seed),
        }

    @staticmethod
    def _run_ids(config: _Config) -> dict[str, str]:
        """The trial's runs by seed: adopted and launched."""
        ids = {**config.adopted, **{seed: job.tracker.run_id for seed, job in config.jobs.items()}}
        return {str(seed): run_id for seed, run_id in sorted(ids.items())}

    def _job_data(self, data: dict[str, Any], number: int, seed: int, params: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)
        if self.sweep.seeds:
            data["seed"] = seed
        swept = ", ".join(f"{k}={params[k]}" for k in self.sweep.space if k in params) or "the base as it is"
        # Not the trial's number: a trial re-asked after an interruption gets a new one, and
        # continues the run whose spec says the same.
        data["description"] = f"A trial of sweep {self.sweep.name}: {swept}."
        data["tracking"] = {**self.sweep.tracking.model_dump(), "run_name": self._name(number, params, seed)}
        return data

    def _launch(self, config: _Config, seed: int) -> None:
        number = config.trial.number
        spec = spec_from_dict(self._job_data(config.data, number, seed, config.params), source=f"trial {number}")
        tracker = Tracker(spec.tracking)
        tags = self._tags(number, config.params, spec.seed)
        restore = sweep_runs.resume_run(self.study, self.client, tracker, config.params, spec.seed, tags)
        if not restore:
            tracker.start(spec, parent_run_id=self.parent, tags=tags)
        assert tracker.run_id is not None
        with tracker.failing():  # an interrupt before the job is registered still ends its run
            actor = self.runner.options(
                num_cpus=self.sweep.trial_resources.num_cpus, num_gpus=self.sweep.trial_resources.num_gpus
            ).remote(self.threads)
            job = _Job(config, seed, actor, tracker)
            config.jobs[seed] = job
            config.pending.remove(seed)  # so an interrupt never finds a seed in neither
        config.trial.set_user_attr("mlflow_run_ids", self._run_ids(config))
        folder = str(checkpoint_folder(tracker.uri, tracker.run_id))
        self.refs[actor.run.remote(spec.model_dump(mode="json"), folder, restore)] = job

    def _drain(self, job: _Job) -> None:
        """Stream a job's new metrics and evaluation tables to its child run; report seed
        means to Optuna."""
        import ray

        config = job.config
        new_metrics, tables = ray.get(job.actor.poll.remote())
        for step, rows in tables:
            job.tracker.on_eval_rows(step, rows)
        for step, metrics in new_metrics:
            job.tracker.on_metrics(step, metrics)
            value = metrics.get(self.sweep.objective)
            if step == 0 or value is None or not math.isfinite(value) or config.stopping:  # 0: before training
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
            # it stopped when asked, or its last metrics (drained just now) pruned it as it ended:
            # the trial is pruned, so its run says so too
            if out["state"] == "pruned" or config.pruned:
                job.tracker.flush()
                end_run(self.client, job.tracker.run_id, "KILLED", "pruned" if config.pruned else "stopped")
            else:
                value = out["final"].get(self.sweep.objective, math.nan)
                if not math.isfinite(value):
                    raise RuntimeError(f"objective {self.sweep.objective!r} was not logged (final value {value})")
                config.values[job.seed] = value  # before the run is FINISHED: an interrupt between tells it
                measured = [s["staleness/token_mean"] for s in out["history"].steps if "staleness/token_mean" in s]
                if measured:
                    config.token_staleness[job.seed] = statistics.fmean(measured)
                job.tracker.finish(out["history"])
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
        if config.reported:
            trial.set_user_attr("last_step", max(config.reported))
        if config.token_staleness:  # the x of a sweep with in-flight arms (see report.staleness_table)
            trial.set_user_attr("token_staleness", statistics.fmean(config.token_staleness.values()))
        if config.error is not None:
            trial.set_user_attr("error", config.error)
            self.study.tell(trial, state=TrialState.FAIL)
        elif config.pruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, statistics.fmean(config.values.values()))
        del self.configs[trial.number]
        self._report(trial.number)

    def _report(self, number: int) -> None:
        if self.on_trial is not None:
            row = next(r for r in trial_rows(self.study, self.sweep) if r["number"] == number)
            self.on_trial(row)
