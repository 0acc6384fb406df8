"""MLflow tracking: the one place that turns the core's metrics into MLflow calls.

Default store: ``sqlite:///mlflow/mlflow.db`` with artifacts in ``mlflow/artifacts``
(relative to the working directory); ``MLFLOW_TRACKING_URI`` or ``tracking.uri``
override it, as everywhere in MLflow. A run gets the whole resolved spec as flattened
params and as ``spec.yaml``, tags (spec hash, git commit, mode, algorithm), per-step
metrics sent in batches with ``log_batch``, and at the end plots, the history as
CSV/JSON and the timeline. A run that fails is marked FAILED with its error; it is
never left RUNNING.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from asyncrlhf.orchestration import RunHistory
from pipelines.spec import ExperimentSpec, TrackingSpec
from pipelines.spec.files import flatten, inapplicable, spec_hash
from pipelines.tracking.evaltable import EvalTable
from pipelines.tracking.names import experiment_runs, run_tags, save_view
from pipelines.tracking.signals import shielded
from pipelines.tracking.store import (
    ARTIFACTS_TAG,
    DEFAULT_TRACKING_URI,
    Heartbeat,
    end_run,
    open_store,
    owner_tags,
    read_run,
    resolve_tracking_uri,
)
from pipelines.tracking.system import SystemMetrics

__all__ = [
    "DEFAULT_TRACKING_URI",
    "Tracker",
    "artifact_root_for",
    "end_run",
    "experiment_id_for",
    "knobs",
    "new_run",
    "open_store",
    "plot_title",
    "read_run",
    "resolve_tracking_uri",
    "tag_experiments",
]

_FIGURE_MARK = "time/total_s"  # a whole-run figure every finished run has logged
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def artifact_root_for(uri: str) -> str | None:
    """For a local SQLite store, ``artifacts/`` beside the database (as a file URI)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "artifacts").as_uri()
    return None  # a server or other store chooses its own


def experiment_id_for(client: Any, name: str, uri: str) -> str:
    """The id of MLflow experiment ``name``, created (artifacts beside a local store) if new,
    and tagged as model training: MLflow 3's UI then opens it on the runs table, not on
    the GenAI traces page."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    root = artifact_root_for(uri)
    tags = {**EXPERIMENT_TAGS, ARTIFACTS_TAG: "beside-store"} if root else EXPERIMENT_TAGS
    return client.create_experiment(name, artifact_location=root, tags=tags)


def tag_experiments(client: Any) -> list[Any]:
    """Tag the store's experiments (but ``Default``) for model training where untagged;
    them, the most recently active first."""
    experiments = [e for e in client.search_experiments(order_by=["last_update_time DESC"]) if e.name != "Default"]
    for experiment in experiments:
        for key, value in EXPERIMENT_TAGS.items():
            if key not in experiment.tags:
                client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiments


def plot_title(run_name: str, params: dict[str, str]) -> str:
    """``name — grpo, async (max_staleness 1), lr 0.0003``: a run's plot title."""
    mode = params.get("orchestrator.mode", "?")
    bound = (
        f" (lag {params.get('orchestrator.lag')})"
        if mode == "lagged"
        else (f" (max_staleness {params.get('buffer.max_staleness')})" if mode == "async" else "")
    )
    return f"{run_name} — {params.get('algorithm.name', '?')}, {mode}{bound}, lr {params.get('trainer.lr', '?')}"


def knobs(spec: ExperimentSpec) -> dict[str, str]:
    """The spec's flattened fields that apply to it: not its bookkeeping (name, description,
    where it is tracked: tags), not an option of a kind it does not use (a decoded reward's
    timeout on an exact-match reward, Ray's resources of a local run: see
    :func:`~pipelines.spec.files.when`), not an unset one (null, an empty list). "Show diff
    only" then shows what was changed."""
    bookkeeping = ("name", "description", "tracking.")
    dropped = tuple(inapplicable(spec))
    return {
        k: v
        for k, v in flatten(spec).items()
        if not k.startswith(bookkeeping)
        and v not in ("null", "[]")
        and not any(k == d or k.startswith(d + ".") for d in dropped)
    }


def new_run(
    client: Any,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, str] | None = None,
    start_time: int | None = None,
) -> str:
    """Create a run in ``experiment`` (created if new) with its tags and params, started at
    ``start_time`` (ms; default now); its id."""
    from mlflow.entities import Param

    experiment_id = experiment_id_for(client, experiment, client.tracking_uri)
    tags = {**tags, **owner_tags()}
    run_id = client.create_run(experiment_id, start_time, tags, run_name).info.run_id
    batch = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
    if batch:  # MLflow splits a batch to its request limits itself
        client.log_batch(run_id, params=batch, synchronous=True)
    return run_id


class Tracker:
    """One MLflow run: ``start`` → ``on_metrics`` per step → ``finish`` or ``fail``."""

    def __init__(self, tracking: TrackingSpec) -> None:
        self.config = tracking
        self.uri = resolve_tracking_uri(tracking.uri)
        self.client = open_store(self.uri)
        self.heartbeat = Heartbeat(self.client)
        self.run_id: str | None = None
        self.step_seconds = 0.0  # time spent in per-step tracking (the on_metrics callback)
        self.step_cpu_seconds = 0.0  # and the CPU time of the thread that spent it
        self.finish_seconds = 0.0  # time spent on final metrics, plots and artifacts
        self._pending: list[Any] = []
        self._steps_since_flush = 0
        self.title = ""  # what the run's plots are titled with
        self._system: Any = None  # MLflow's system-metrics monitor, while the run lives
        self._logged_until = -1  # a resumed run: steps up to here are in the store already
        self._table_until = -1  # and evaluations up to here are in its table
        self._table: EvalTable | None = None
        self._figures_step = 0  # whole-run figures go at the step this process began from
        self._opening_figures: dict[str, float] = {}  # known at the start, logged after the first step
        self._ended = False

    # ------------------------------------------------------------- lifecycle
    def start(self, spec: ExperimentSpec, parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> str:
        """Create the run and log the resolved spec before the first step; a failure once
        the run exists marks it FAILED.

        ``parent_run_id`` nests the run under a sweep's parent run; ``tags`` are added.
        """
        from mlflow.entities import Param

        experiment_id = experiment_id_for(self.client, self.config.experiment, self.uri)
        tags = {
            **(tags or {}),
            "spec_hash": spec_hash(spec),
            "mode": spec.orchestrator.mode,
            "algorithm": spec.algorithm.name,
            "engine": spec.rollout.engine,
            "asyncrlhf.status": "running",
            **owner_tags(),
            **self.config.tags,
        }
        others = experiment_runs(self.client, experiment_id)  # once: for its colour and for the view
        tags.update(run_tags(others, knobs(spec), tags))
        if parent_run_id is not None:
            tags["mlflow.parentRunId"] = parent_run_id
        tags["spec.name"] = spec.name  # bookkeeping as tags: the params are the experiment's knobs
        if spec.description:
            tags["mlflow.note.content"] = spec.description  # the run's description box in the UI
        with self.failing():
            with shielded():  # a signal between the run's creation and its id's record left it RUNNING
                run = self.client.create_run(experiment_id, tags=tags, run_name=self.config.run_name or spec.name)
                self.run_id = run.info.run_id
            self.title = plot_title(run.info.run_name, knobs(spec))
            if parent_run_id is None:  # a sweep saves its experiment's view, by its objective
                save_view(self.client, experiment_id, runs=[run, *others])
            self.heartbeat.beat(self.run_id)
            self._monitor_system(resumed=False)
            params = [Param(k, v[:6000]) for k, v in knobs(spec).items()]
            self.client.log_batch(self.run_id, params=params, synchronous=True)  # MLflow splits it to its limits
            text = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
            self.client.log_text(self.run_id, text, "spec.yaml")
        return self.run_id

    def resume(self, run_id: str, from_step: int, restored: list[dict[str, float]]) -> None:
        """Reopen ``run_id`` (RUNNING again, owned by this process) to continue it from
        checkpoint ``from_step``, whose ``restored`` steps are logged where the store
        lacks them (metrics not yet flushed when the process died); no step is logged
        twice. The run records how often, and from which steps, it resumed."""
        from mlflow.entities import RunTag

        run = self.client.get_run(run_id)
        self.run_id = run_id
        self.title = plot_title(run.info.run_name, run.data.params)
        history = self.client.get_metric_history(run_id, "loss/policy")
        self._logged_until = max((m.step for m in history), default=0)
        self._table = EvalTable(self.client, run_id)
        self._table_until = self._table.load()
        # Whole-run figures at a step of their own if an earlier process logged them (a
        # finished run continued), else at step 0 (its final upload never got that far).
        self._figures_step = from_step if _FIGURE_MARK in run.data.metrics else 0
        count = int(run.data.tags.get("resume.count", "0")) + 1
        steps = [*json.loads(run.data.tags.get("resume.from_steps", "[]")), from_step]
        tags = {
            "resume.count": str(count),
            "resume.from_steps": json.dumps(steps),
            "asyncrlhf.status": "running",
            **owner_tags(),
        }
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
        self.client.update_run(run_id, status="RUNNING")
        if "error" in run.data.tags:  # why it stopped last time: no longer true of a live run
            self.client.delete_tag(run_id, "error")
        self._ended = False
        self.heartbeat.beat(run_id)
        self._monitor_system(resumed=True)
        with self.failing():
            for step, metrics in enumerate(restored, 1):
                self.on_metrics(step, metrics)
            self.flush()

    @contextlib.contextmanager
    def failing(self) -> Iterator[None]:
        """Inside, any error (a stop request or Ctrl-C included) ends the run: FAILED with
        the error, or KILLED for an interrupt; then it propagates."""
        try:
            yield
        except BaseException as error:
            self.fail(error)
            raise

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """The core's ``on_metrics`` callback: queue, and flush every ``flush_every`` steps.
        Step 0 (the evaluation before any update) is sent at once, stamped when measured."""
        from mlflow.entities import Metric

        if step <= self._logged_until:
            return
        begin, cpu = time.perf_counter(), time.thread_time()
        now = int(time.time() * 1000)
        self._pending.extend(
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if key != "step" and isinstance(value, int | float) and math.isfinite(value)
        )
        self._steps_since_flush += 1
        if step == 0 or self._steps_since_flush >= self.config.flush_every:
            self.flush()
        if self._opening_figures:  # after the first step's metrics: MLflow's compare view picks its
            self.log_figures(self._opening_figures)  # default axes in the order metrics were logged
            self._opening_figures = {}
        self.step_seconds += time.perf_counter() - begin
        self.step_cpu_seconds += time.thread_time() - cpu

    def on_eval_rows(self, step: int, rows: dict[str, list[Any]]) -> None:
        """One evaluation's rows, put first in the run's ``eval/samples.json`` table."""
        if step <= self._table_until:
            return
        begin, cpu = time.perf_counter(), time.thread_time()
        assert self.run_id is not None
        self._table = self._table or EvalTable(self.client, self.run_id)
        self._table.add(rows)
        self.step_seconds += time.perf_counter() - begin
        self.step_cpu_seconds += time.thread_time() - cpu

    def flush(self) -> None:
        assert self.run_id is not None, "start() first"
        pending, self._pending, self._steps_since_flush = self._pending, [], 0
        if pending:  # MLflow splits a batch to its request limits itself
            self.client.log_batch(self.run_id, metrics=pending, synchronous=True)

    def log_opening_figures(self, figures: dict[str, float]) -> None:
        """Whole-run figures known before training (the data's counts): logged at step 0
        once the first step's metrics are, so ``eval/accuracy`` leads the run's metrics."""
        self._opening_figures = dict(figures)

    def log_figures(self, figures: dict[str, float] | dict[str, int]) -> None:
        """Whole-run figures, one value each: at step 0, or, for a resumed run that logged
        them before, at the step it resumed from, so no step carries two values of one
        figure and the latest value is the one that describes the whole run."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = self._figures_step
        metrics = [Metric(k, float(v), now, step) for k, v in figures.items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=metrics, synchronous=True)

    def finish(self, history: RunHistory, extra: dict[str, float] | None = None, status: str = "FINISHED") -> None:
        """Final metrics, artifacts, and ``status`` (FINISHED; KILLED for a pruned trial)."""
        from pipelines.tracking.plots import plot_curves, plot_run_staleness, plot_timeline

        begin = time.perf_counter()
        self.flush()
        # Whole-run figures, at step 0 (see log_figures): one value each, which MLflow draws as a bar
        # (at the last step they were lone dots on a 399–400.5 axis). Those the per-step
        # stream already carries (cumulative throughput) are not logged again.
        per_step = set(history.steps[-1]) if history.steps else set()
        self.log_figures({k: v for k, v in {**history.summary, **(extra or {})}.items() if k not in per_step})
        with tempfile.TemporaryDirectory(prefix="asyncrlhf-") as tmp:
            artifacts = Path(tmp)
            _write_history(history, artifacts)
            plot_curves(history, artifacts / "curves.png", self.title)
            plot_run_staleness(history, artifacts / "staleness.png", self.title)
            plot_timeline(history, artifacts / "timeline.png", self.title)
            for path in sorted(artifacts.iterdir()):
                folder = "plots" if path.suffix == ".png" else "history"
                self.client.log_artifact(self.run_id, str(path), folder)
        with shielded():
            self._end(status, "finished" if status == "FINISHED" else "stopped")
        self.finish_seconds += time.perf_counter() - begin

    def fail(self, error: BaseException) -> None:
        """Mark the run FAILED with its error, or KILLED for an interrupt (never leave it
        RUNNING); once only, keeping the metrics sent so far."""
        if self.run_id is None or self._ended:
            return
        message = f"{type(error).__name__}: {error}"[:4000]
        killed = isinstance(error, KeyboardInterrupt)
        with shielded(reraise=False):  # a second Ctrl-C waits: the run is marked before the process exits
            try:
                self.flush()
            except Exception as err:  # a full disk, say: the error that ended the run is the one to report
                warnings.warn(f"the last metrics could not be logged ({type(err).__name__}: {err})", stacklevel=2)
            self._end("KILLED" if killed else "FAILED", "killed" if killed else "failed", {"error": message})

    def _monitor_system(self, resumed: bool) -> None:
        if self.config.system_metrics:
            assert self.run_id is not None
            self._system = SystemMetrics(self.run_id, self.uri, resumed)
            if not self._system.start():
                self._system = None

    def _end(self, status: str, label: str, tags: dict[str, str] | None = None) -> None:
        assert self.run_id is not None
        self._ended = True
        self.heartbeat.stop(self.run_id)
        if self._system is not None:
            self._system.finish()
            self._system = None
        end_run(self.client, self.run_id, status, label, tags)


def _write_history(history: RunHistory, folder: Path) -> None:
    """``history.csv`` (an integer ``step`` column first, step 0 the evaluation before any
    update), ``history.json`` and ``timeline.json``."""
    rows = [{"step": 0, **history.initial_metrics}] if history.initial_metrics else []
    rows += [{**s, "step": i} for i, s in enumerate(history.steps, 1)]
    keys = ["step", *sorted({k for row in rows for k in row} - {"step"})]
    lines = [",".join(keys)]
    lines += [
        ",".join([str(row["step"]), *("" if k not in row else repr(float(row[k])) for k in keys[1:])]) for row in rows
    ]
    (folder / "history.csv").write_text("\n".join(lines) + "\n")
    (folder / "history.json").write_text(
        json.dumps(
            {
                "mode": history.mode,
                "initial_metrics": history.initial_metrics,
                "summary": history.summary,
                "steps": history.steps,
            },
            indent=1,
        )
    )
    (folder / "timeline.json").write_text(json.dumps([[e.worker, e.phase, e.start, e.end] for e in history.timeline]))
