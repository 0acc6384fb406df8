"""The tracking store: opened once per process, initialised under a lock, and kept true.

Two things go wrong with a shared MLflow store that MLflow itself does not handle:

- **Concurrent first use.** Opening a new SQLite store creates and migrates its tables;
  two processes doing so at once fail (``duplicate column name``, ``index ... already
  exists``). :func:`open_store` initialises a SQLite store under a file lock beside the
  database, so one process migrates and the others wait, then find it ready.
- **Runs whose process died.** A run killed with SIGKILL (or by the OOM killer, or a
  power cut) cannot close itself and would stay RUNNING forever. Every run this
  platform creates carries its owner (host, pid and the process's start time) and a
  heartbeat tag refreshed while it lives. :func:`reconcile` — run by
  :func:`open_store`, so by every ``asyncrlhf`` command that touches the store — marks
  KILLED each RUNNING run whose owner process on this host is gone, and each run of
  another host whose heartbeat is older than :data:`STALE_AFTER_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ARTIFACTS_TAG",
    "HEARTBEAT_TAG",
    "OWNER_TAG",
    "STALE_AFTER_S",
    "Heartbeat",
    "end_run",
    "open_store",
    "owner_tags",
    "read_run",
    "reconcile",
    "relocate",
    "resolve_tracking_uri",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow/mlflow.db"
OWNER_TAG, HEARTBEAT_TAG = "asyncrlhf.owner", "asyncrlhf.heartbeat"
ARTIFACTS_TAG = "asyncrlhf.artifacts"  # experiment tag: its artifacts live beside the store's database
HEARTBEAT_S = 60.0  # how often a live run refreshes its heartbeat
STALE_AFTER_S = 15 * 60.0  # a run of another host with no heartbeat for this long is dead
_opened: dict[str, Any] = {}


def resolve_tracking_uri(configured: str | None = None) -> str:
    """``configured``, else ``$MLFLOW_TRACKING_URI``, else the local SQLite store."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def open_store(configured: str | None = None) -> Any:
    """An ``MlflowClient`` on the resolved store: checked (a damaged SQLite file is a
    :class:`~pipelines.tracking.integrity.StoreError`), initialised (a new SQLite store under a
    file lock), and reconciled once per process."""
    from mlflow import MlflowClient

    uri = resolve_tracking_uri(configured)
    if uri in _opened:
        return _opened[uri]
    # Small files (a spec, the evaluation table appended to): no progress bars on stderr.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if uri.startswith("sqlite:///"):
        from filelock import FileLock

        from pipelines.tracking.integrity import check_sqlite, store_errors

        db = Path(uri.removeprefix("sqlite:///"))
        with FileLock(str(db) + ".lock", timeout=300), store_errors(db, "the MLflow store"):
            check_sqlite(db, "the MLflow store", beside=("artifacts", "checkpoints"))
            new = not db.exists() or db.stat().st_size == 0
            client = MlflowClient(tracking_uri=uri)  # the store: its tables created and migrated if needed
            client.search_experiments(max_results=1)
            if new:  # MLflow makes an empty "Default" experiment nothing here uses: keep the UI's list to ours
                client.delete_experiment("0")
            relocate(db)
            reconcile(client)  # the first queries of the runs table: damage there shows here
    else:
        client = MlflowClient(tracking_uri=uri)
        reconcile(client)
    _opened[uri] = client
    return client


def relocate(db: Path) -> list[str]:
    """Point the artifacts of a moved or copied store (a renamed clone, the ``mlflow``
    folder copied elsewhere) at the ``artifacts`` folder beside its database now; the ids
    of the experiments moved.

    MLflow stores an experiment's artifact location as an absolute URI when the
    experiment is created, so a moved store would go on writing into (or reading from)
    the old folder. Experiments created here (tagged ``asyncrlhf.artifacts``), and older
    ones whose artifacts were beside a database in a folder of the same name, are moved;
    an experiment given another location is left alone.
    """
    import sqlite3

    root = (db.resolve().parent / "artifacts").as_uri()
    moved: list[str] = []
    with contextlib.closing(sqlite3.connect(db, timeout=60)) as con, con:
        tagged = {
            row[0] for row in con.execute("SELECT experiment_id FROM experiment_tags WHERE key = ?", (ARTIFACTS_TAG,))
        }
        for experiment, old in con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall():
            ours = experiment in tagged or (old or "").endswith(f"/{db.parent.name}/artifacts")
            if not ours or old == root or not (old or "").startswith("file://"):
                continue
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (root, experiment))
            for table, column in [("runs", "artifact_uri"), ("logged_models", "artifact_location")]:
                con.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE experiment_id = ? AND substr({column}, 1, ?) = ?",
                    (root, len(old) + 1, experiment, len(old) + 1, old + "/"),
                )
            moved.append(str(experiment))
    return moved


def owner_tags() -> dict[str, str]:
    """Tags naming this process as a run's owner, and a fresh heartbeat."""
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(os.getpid())}
    return {OWNER_TAG: json.dumps(owner), HEARTBEAT_TAG: str(int(time.time()))}


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid
    from the owner; None where /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, started: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's live process
    return started is None or _process_start(pid) in (started, None)


def _dead_owner(tags: dict[str, str], now: float) -> str | None:
    """Why the run's owner is known to be gone, or None while it may live."""
    try:
        owner = json.loads(tags[OWNER_TAG])
    except (KeyError, ValueError):
        return None  # not one of ours, or from before owners were recorded
    if owner.get("host") == socket.gethostname():
        if _alive(int(owner["pid"]), owner.get("started")):
            return None
        where = f"its process {owner['pid']} on {owner['host']}"
        return f"{where} ended without closing it (killed with SIGKILL, or crashed)"
    beat = float(tags.get(HEARTBEAT_TAG, "0"))
    if now - beat < STALE_AFTER_S:
        return None
    return f"no heartbeat from its process {owner.get('pid')} on {owner.get('host')} for {(now - beat) / 60:.0f} min"


def live_owner(tags: dict[str, str]) -> str | None:
    """The process that owns a run and may still be running it (not this process), as
    words; None when the run has no such owner."""
    try:
        owner = json.loads(tags[OWNER_TAG])
    except (KeyError, ValueError):
        return None
    if owner.get("host") == socket.gethostname() and int(owner.get("pid", -1)) == os.getpid():
        return None
    if _dead_owner(tags, time.time()) is not None:
        return None
    return f"process {owner.get('pid')} on {owner.get('host')}"


def reconcile(client: Any) -> list[str]:
    """Mark KILLED every RUNNING run whose owner is gone; the ids of those marked."""
    from mlflow.entities import ViewType

    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    running = client.search_runs(experiments, "attributes.status = 'RUNNING'", max_results=5000)
    now, marked = time.time(), []
    for run in running:
        why = _dead_owner(run.data.tags, now)
        if why is not None:
            end_run(client, run.info.run_id, "KILLED", "killed", {"error": f"reconciled: {why}"[:4000]})
            marked.append(run.info.run_id)
    return marked


def end_run(client: Any, run_id: str, status: str, label: str, tags: dict[str, str] | None = None) -> None:
    """Terminate a run as ``status`` (FINISHED, FAILED, KILLED) with its
    ``asyncrlhf.status`` tag (``label``) and any further tags; a run deleted from the
    store is nothing to end."""
    from mlflow.entities import RunTag

    try:
        batch = [RunTag("asyncrlhf.status", label), *(RunTag(k, v) for k, v in (tags or {}).items())]
        client.log_batch(run_id, tags=batch, synchronous=True)
        client.set_terminated(run_id, status=status)
    except Exception as err:
        if getattr(err, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            return
        import warnings

        warnings.warn(
            f"run {run_id} could not be marked {status} ({type(err).__name__}: {err}); the next asyncrlhf "
            "command on this store marks it KILLED",
            stacklevel=2,
        )


class Heartbeat:
    """Refreshes the heartbeat tag of live runs from a daemon thread, so a run of
    another host that stops beating can be told dead. ``beat(run_id)`` adds a run;
    ``stop(run_id)`` removes it (the thread ends with the last one)."""

    def __init__(self, client: Any, every_s: float = HEARTBEAT_S) -> None:
        self.client, self.every_s = client, every_s
        self._runs: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, run_id: str) -> None:
        with self._lock:
            self._runs.add(run_id)
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._loop, name="asyncrlhf-heartbeat", daemon=True)
                self._thread.start()

    def stop(self, run_id: str) -> None:
        with self._lock:
            self._runs.discard(run_id)
            if not self._runs:
                self._wake.set()

    def _loop(self) -> None:
        while not self._wake.wait(self.every_s):
            with self._lock:
                runs = list(self._runs)
            for run_id in runs:
                with contextlib.suppress(Exception):  # the store is busy or gone: the next beat tries again
                    self.client.set_tag(run_id, HEARTBEAT_TAG, str(int(time.time())), synchronous=True)


def read_run(client: Any, run_id: str) -> tuple[Any, dict[str, Any], str]:
    """``(run, spec mapping, experiment name)`` of a run this platform logged.

    Raises:
        LookupError: no such run in the store, or one without its ``spec.yaml``.
    """
    try:
        run = client.get_run(run_id)
    except Exception:
        raise LookupError(f"no run {run_id!r} in {client.tracking_uri}") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "spec.yaml", tmp)
        except Exception:
            raise LookupError(f"run {run_id!r} has no spec.yaml: not an asyncrlhf run") from None
        try:
            spec = yaml.safe_load(Path(path).read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise LookupError(f"run {run_id!r}: its spec.yaml cannot be read ({type(err).__name__})") from None
    if not isinstance(spec, dict):
        raise LookupError(f"run {run_id!r}: its spec.yaml is not a spec (a mapping), got {type(spec).__name__}")
    experiment = client.get_experiment(run.info.experiment_id).name
    return run, spec, experiment
