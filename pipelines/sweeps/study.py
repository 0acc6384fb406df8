"""The Optuna side of a sweep, through Optuna's public API only.

Every sweep is a study in SQLite (``optuna.db`` beside the MLflow database by default).
A grid enqueues its combinations; an ``optuna`` sweep asks a seeded TPE sampler. A trial
cut off by an interrupt (Ctrl-C, or a driver killed outright) is failed, listed in the
study's ``interrupted`` attribute so it never counts, and its parameters are queued
again: a sweep resumes where it stopped and never reruns a finished trial.

One driver at a time per study: :func:`driver_lock` holds a file lock for the study
while a driver runs it, so a second copy of the same sweep refuses at once (naming the
first's process) instead of taking the first's live trials for stale ones. The lock is
a file beside a SQLite storage (or in the temporary directory for a server storage, so
it guards one machine only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.spec.files import SpecError
from pipelines.sweeps.spec import SweepSpec, choice_label

__all__ = [
    "counted",
    "default_storage",
    "driver_lock",
    "enqueue_grid_point",
    "interrupt",
    "make_study",
    "stale_trials",
    "suggest",
    "trial_params",
]

INTERRUPTED = "interrupted"  # study attribute: numbers of trials cut off by an interrupt
GRID_NEXT = "grid_next"  # study attribute: how many grid points have been enqueued
GRID_INDEX = "grid_index"  # trial attribute: the grid point it was enqueued as


def default_storage(tracking_uri: str) -> str:
    """``optuna.db`` beside a local MLflow SQLite store, else ``mlflow/optuna.db``."""
    if tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).parent / 'optuna.db'}"
    Path("mlflow").mkdir(exist_ok=True)
    return "sqlite:///mlflow/optuna.db"


@contextlib.contextmanager
def driver_lock(storage: str, study_name: str) -> Iterator[None]:
    """Hold the study's driver lock while inside; a SpecError if another driver holds it."""
    from filelock import FileLock, Timeout

    if storage.startswith("sqlite:///"):
        db = Path(storage.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        base = db.with_name(f"{db.name}.{study_name}")
    else:
        digest = hashlib.sha256(f"{storage} {study_name}".encode()).hexdigest()[:16]
        base = Path(tempfile.gettempdir()) / f"asyncrlhf-sweep-{digest}"
    lock, owner = FileLock(f"{base}.lock"), Path(f"{base}.owner")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "another process"
        raise SpecError(
            f"sweep study {study_name!r} in {storage} is being run by {holder}: wait for it to finish, or stop it "
            "(Ctrl-C), then run this command again to resume"
        ) from None
    try:
        owner.write_text(f"pid {os.getpid()} on {socket.gethostname()}\n")
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def _signature(sweep: SweepSpec, base: dict[str, Any]) -> str:
    """What makes two calls the same study (the trial count may change)."""
    fixed = sweep.model_dump(mode="json", include={"method", "space", "objective", "direction", "seed", "seeds"})
    return hashlib.sha256(json.dumps([fixed, base], sort_keys=True).encode()).hexdigest()[:12]


def make_study(sweep: SweepSpec, base: dict[str, Any], storage: str) -> Any:
    """Create or reopen the sweep's study; refuse one made by a different sweep. A grid's
    combinations are enqueued (once)."""
    import optuna

    from pipelines.tracking.integrity import check_sqlite, store_errors

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = Path(storage.removeprefix("sqlite:///")) if storage.startswith("sqlite:///") else None
    if db is not None:
        check_sqlite(db, "the sweeps' Optuna store")
    with store_errors(db, "the sweeps' Optuna store"):
        return _make_study(sweep, base, storage)


def _make_study(sweep: SweepSpec, base: dict[str, Any], storage: str) -> Any:
    import optuna

    # A resumed study's sampler continues the seed sequence: reseeded with sweep.seed alone
    # it would draw trial 0's parameters again while still in its random start-up phase.
    known = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}
    seed = sweep.seed + known.get(sweep.study_name, 0)
    if sweep.method == "grid":
        sampler: Any = optuna.samplers.RandomSampler(seed=seed)  # every grid trial is enqueued
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, sweep.num_trials // 3)))
    if sweep.prunes:
        pruner: Any = optuna.pruners.MedianPruner(sweep.pruner.n_startup_trials, sweep.pruner.n_warmup_steps)
    else:
        pruner = optuna.pruners.NopPruner()
    study = optuna.create_study(
        storage=storage,
        study_name=sweep.study_name,
        sampler=sampler,
        pruner=pruner,
        direction=sweep.direction,
        load_if_exists=True,
    )
    signature, known = _signature(sweep, base), study.user_attrs.get("sweep_hash")
    if known is None:
        study.set_user_attr("sweep_hash", signature)
    if known is not None and known != signature:
        raise SpecError(
            f"study {sweep.study_name!r} in {storage} was created by a different sweep (base, space, objective "
            "or method changed): give the sweep a new name, or delete the study to start over"
        )
    if sweep.method == "grid" and GRID_NEXT not in study.user_attrs:
        # A new study enqueues its points one at a time (enqueue_grid_point); one made before
        # that had every point enqueued at its creation.
        study.set_user_attr(GRID_NEXT, sweep.num_trials if study.get_trials(deepcopy=False) else 0)
    return study


def enqueue_grid_point(sweep: SweepSpec, study: Any) -> None:
    """Before an ``ask`` of a grid sweep: enqueue its next point unless one is waiting (an
    interrupted trial's, queued again). Points go in one at a time, in the grid's order
    (``itertools.product``): enqueueing a 10⁶-point grid up front, each checked against
    every trial before it, took minutes before the first trial could start."""
    from optuna.trial import TrialState

    index = int(study.user_attrs.get(GRID_NEXT, 0))
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    # A point enqueued by a driver stopped (SIGKILL) before it counted it: counted now, or
    # it would be enqueued again once this one is asked, and the grid's last point never
    latest = max((t.user_attrs.get(GRID_INDEX, -1) for t in waiting), default=-1)
    if latest >= index:
        study.set_user_attr(GRID_NEXT, latest + 1)
    if waiting:
        return
    if index >= sweep.num_trials:
        return
    labels = [[choice_label(v) for v in values] for values in sweep.space.values()]
    point, rest = {}, index
    for key, choices in reversed(list(zip(sweep.space, labels, strict=True))):  # the last axis varies fastest
        rest, position = divmod(rest, len(choices))
        point[key] = choices[position]
    study.enqueue_trial({key: point[key] for key in sweep.space}, user_attrs={GRID_INDEX: index})
    study.set_user_attr(GRID_NEXT, index + 1)


def suggest(trial: Any, key: str, values: Any) -> Any:
    """The trial's value of one swept field (a list: categorical; a range: int or float)."""
    if isinstance(values, list):  # a mapping (a whole section) is suggested by its label
        return trial.suggest_categorical(key, [choice_label(v) for v in values])
    if values.type == "int":
        step = int(values.step or 1)
        return trial.suggest_int(key, int(values.low), int(values.high), step=step, log=values.log)
    return trial.suggest_float(key, values.low, values.high, step=values.step, log=values.log)


def interrupt(study: Any, number: int, params: dict[str, Any]) -> bool:
    """Cut off trial ``number``: failed, never counted, its parameters queued again. A
    trial already told (a stop that landed just after its ``tell``) is left as it is;
    False then."""
    from optuna.trial import TrialState

    if number not in {t.number for t in stale_trials(study)}:
        return False
    cut = set(study.user_attrs.get(INTERRUPTED, []))
    study.set_user_attr(INTERRUPTED, sorted(cut | {number}))
    study.tell(number, state=TrialState.FAIL)
    study.enqueue_trial(params)
    return True


def trial_params(trial: Any) -> dict[str, Any]:
    """A trial's parameters, also when it was cut off before suggesting them: then the
    values Optuna fixed for it (a grid point, an enqueued trial) are its parameters."""
    return dict(trial.params or trial.system_attrs.get("fixed_params", {}))


def stale_trials(study: Any) -> list[Any]:
    """Trials left RUNNING by a driver that was killed (no process runs them any more)."""
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def counted(study: Any) -> list[Any]:
    """Finished trials that count toward the target (not those cut off by an interrupt)."""
    from optuna.trial import TrialState

    cut = set(study.user_attrs.get(INTERRUPTED, []))
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [t for t in study.get_trials(deepcopy=False, states=done) if t.number not in cut]
