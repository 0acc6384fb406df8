"""True run states and refused inputs (issue 16): reconciliation of runs whose process
died, the store initialised once under concurrent first use, a failure before the first
step, an interrupt before the run exists, sizes that cannot fit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from asyncrlhf.models import PIECE_BYTES
from pipelines import cli as cli_module
from pipelines.run import run_experiment
from pipelines.spec import load_spec
from pipelines.spec.files import SpecError
from pipelines.spec.memory import check_fits, estimate_bytes, rank_bytes, weight_bytes
from pipelines.tracking.store import HEARTBEAT_TAG, OWNER_TAG, STALE_AFTER_S, open_store, reconcile
from tests.helpers import patience
from tests.pipelines.conftest import REPO, env

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
TINY = ["trainer.steps=2", "trainer.batch_size=16", "orchestrator.eval_every=1", "task.eval_size=8"]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def owned_run(client: MlflowClient, experiment: str, host: str, pid: int, beat: float) -> str:
    owner = json.dumps({"host": host, "pid": pid, "started": None})
    tags = {OWNER_TAG: owner, HEARTBEAT_TAG: str(int(beat))}
    return client.create_run(experiment, tags=tags).info.run_id


def test_runs_whose_process_is_gone_are_marked_killed_and_live_ones_are_left(store):
    client = MlflowClient(store)
    experiment = client.create_experiment("owners")
    here, now = socket.gethostname(), time.time()
    dead = owned_run(client, experiment, here, dead_pid(), now)  # SIGKILLed: its process is gone
    alive = owned_run(client, experiment, here, os.getpid(), now)
    silent = owned_run(client, experiment, "elsewhere", 1, now - STALE_AFTER_S - 60)  # another host, no heartbeat
    beating = owned_run(client, experiment, "elsewhere", 1, now)
    foreign = client.create_run(experiment).info.run_id  # not ours: no owner, never touched
    assert sorted(reconcile(client)) == sorted([dead, silent])
    status = {run_id: client.get_run(run_id).info.status for run_id in (dead, alive, silent, beating, foreign)}
    assert status == {dead: "KILLED", alive: "RUNNING", silent: "KILLED", beating: "RUNNING", foreign: "RUNNING"}
    tags = client.get_run(dead).data.tags
    assert tags["asyncrlhf.status"] == "killed" and "ended without closing it" in tags["error"]
    assert "no heartbeat" in client.get_run(silent).data.tags["error"]


def test_concurrent_first_use_of_a_new_store_initialises_it_once(tmp_path):
    """Four processes open a store that does not exist yet, at once (unlocked, 1 of 2
    and 3 of 4 used to fail with migration errors)."""
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    code = (
        "import sys; from pipelines.tracking.store import open_store; c = open_store(sys.argv[1]); "
        "c.create_run(c.create_experiment(sys.argv[2]))"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, uri, f"e{i}"], cwd=REPO, env=env(), stderr=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    errors = [p.communicate(timeout=patience(120))[1] for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, errors
    client = MlflowClient(uri)
    names = sorted(e.name for e in client.search_experiments())
    assert names == ["e0", "e1", "e2", "e3"]  # and no empty "Default" in a store made here


def test_a_failure_after_the_run_exists_marks_it_failed(store, tmp_path):
    """The artifact location is unwritable: spec.yaml cannot be logged (a failure before
    the first step, which used to leave the run RUNNING)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    client = open_store(store)
    client.create_experiment("unwritable", artifact_location=(blocker / "artifacts").as_uri())
    spec = load_spec(QUICKSTART, [*TINY, "tracking.experiment=unwritable"])
    with pytest.raises(OSError):
        run_experiment(spec)
    experiment = client.get_experiment_by_name("unwritable").experiment_id
    (run,) = client.search_runs([experiment])
    assert run.info.status == "FAILED" and run.data.tags["asyncrlhf.status"] == "failed"
    assert "Error" in run.data.tags["error"]


def test_an_interrupt_before_the_run_exists_says_so_and_logs_nothing(store, monkeypatch):
    def interrupted(*args, **kwargs):  # Ctrl-C while the model is being built
        raise KeyboardInterrupt

    monkeypatch.setattr("pipelines.run.experiment.build_runtime", interrupted)
    args = ["run", str(QUICKSTART), *[a for o in TINY for a in ("--set", o)]]
    result = CliRunner().invoke(cli_module.app, args)
    assert result.exit_code == 130
    assert "before the MLflow run was created: nothing was logged" in result.output
    assert "marked KILLED" not in result.output
    client = MlflowClient(store)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["rollout.group_size=1000000000", "trainer.batch_size=1000000000"], "trainer.batch_size=1000000000"),
        (["rollout.max_new_tokens=1000000000"], "rollout.max_new_tokens=1000000000"),
        (["model.hidden_size=1000000"], "model.hidden_size=1000000"),
    ],
)
def test_sizes_that_cannot_fit_are_refused_naming_the_field(overrides, field):
    spec = load_spec(QUICKSTART, overrides)
    with pytest.raises(SpecError, match=rf"^{field}.*the run needs about .* of memory, more than the .* available"):
        check_fits(spec)


def test_the_quick_start_is_far_below_any_machine():
    """The estimate exists to catch the absurd: the quick start asks for about 117 MB."""
    total = sum(estimate_bytes(load_spec(QUICKSTART)).values())
    assert 50e6 < total < 300e6
    check_fits(load_spec(QUICKSTART), available=1 << 30)  # fits in 1 GB


def test_the_estimate_knows_ranks_fsdp_shares_the_training_state():
    ray = ["runtime.kind=ray", "runtime.trainer.num_cpus=0.5", "runtime.rollout.num_cpus=0.5"]
    one, p = load_spec(QUICKSTART, ray), weight_bytes(load_spec(QUICKSTART))
    two, ddp = (
        load_spec(QUICKSTART, [*ray, "runtime.trainer.ranks=2", *x]) for x in ([], ["runtime.trainer.parallel=ddp"])
    )
    assert p < PIECE_BYTES  # the quick start's weights are one publication piece
    assert rank_bytes(one) == 4 * p  # weights, gradients, AdamW's two moments
    assert rank_bytes(two) == 2 * p + p  # half the state, and rank 0's publication
    assert rank_bytes(ddp) == 4 * p + p
    model = [estimate_bytes(s)["model"] for s in (one, two, ddp)]  # the ranks and the rollout engine's copy
    assert model == [5 * p, 2 * 3 * p + p, 2 * 5 * p + p]
    big = [*ray, "runtime.trainer.ranks=2", "model.hidden_size=768", "model.intermediate_size=2048"]
    big = [*big, "model.num_layers=8", "model.num_heads=12"]
    streamed, staged = (load_spec(QUICKSTART, [*big, f"runtime.weight_sync={x}"]) for x in ("auto", "collective"))
    p = weight_bytes(streamed)  # 57M parameters: the object store's pieces, or a whole staged copy
    assert rank_bytes(streamed) == 2 * p + PIECE_BYTES and rank_bytes(staged) == 3 * p


def test_a_moved_store_reads_and_writes_the_artifacts_beside_it(tmp_path):
    """MLflow keeps an experiment's artifact location as an absolute URI: a store whose
    folder was moved (a renamed clone) went on writing into the old folder."""
    import shutil

    from pipelines.tracking import experiment_id_for

    first = f"sqlite:///{tmp_path / 'a' / 'mlflow' / 'mlflow.db'}"
    client = open_store(first)
    ours = experiment_id_for(client, "moved", first)
    elsewhere = (tmp_path / "elsewhere").as_uri()
    foreign = client.create_experiment("foreign", artifact_location=elsewhere)  # the user's choice: kept
    run = client.create_run(ours).info.run_id
    client.log_text(run, "before the move", "note.txt")
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = f"sqlite:///{tmp_path / 'b' / 'mlflow' / 'mlflow.db'}"
    client = open_store(moved)
    root = (tmp_path / "b" / "mlflow" / "artifacts").as_uri()
    assert client.get_experiment(ours).artifact_location == root
    assert client.get_run(run).info.artifact_uri == f"{root}/{run}/artifacts"
    assert client.get_experiment(foreign).artifact_location == elsewhere
    assert (tmp_path / "b" / "mlflow" / "artifacts" / run / "artifacts" / "note.txt").read_text() == "before the move"
    assert "before the move" in (Path(client.download_artifacts(run, "note.txt", str(tmp_path))).read_text())
    later = client.create_run(ours).info.run_id
    client.log_text(later, "after", "note.txt")
    assert (tmp_path / "b" / "mlflow" / "artifacts" / later / "artifacts" / "note.txt").exists()
    assert not (tmp_path / "a").exists()  # nothing written to the old place


def test_a_stop_whose_interrupt_was_lost_at_start_up_still_stops_with_a_checkpoint(store, monkeypatch):
    """SIGTERM 5 s into a run on a new store: its KeyboardInterrupt was raised inside a
    finalizer ("Exception ignored in…") and the run trained to the end, FINISHED, exit 0
    (3 of 21 tries). The handler also records the signal; the step loop now polls it."""
    from pipelines.run.checkpoint_store import checkpoint_folder
    from pipelines.run.processes import RunInterrupted
    from pipelines.tracking import signals

    monkeypatch.setattr(signals, "_received", ["SIGTERM"])  # caught at start-up, its interrupt lost
    spec = load_spec(
        QUICKSTART,
        [
            "trainer.steps=20",
            "trainer.batch_size=32",
            "orchestrator.eval_every=0",
            "trainer.checkpoint_every=10",
            f"tracking.uri={store}",
        ],
    )
    with pytest.raises(RunInterrupted, match="SIGTERM: stopped after step 1"):
        run_experiment(spec)
    (run,) = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name("quickstart").experiment_id])
    assert run.info.status == "KILLED"
    assert sorted(p.name for p in checkpoint_folder(store, run.info.run_id).glob("step-*")) == ["step-000001"]


def test_an_interrupt_while_a_new_store_is_created_is_one_before_the_run(store, monkeypatch):
    """It escaped as a bare KeyboardInterrupt, and the CLI said "the MLflow run is marked
    KILLED" when no run existed."""
    from pipelines.run.processes import InterruptedBeforeRun
    from pipelines.tracking import tracker as tracking

    def interrupted(self, config):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(tracking.Tracker, "__init__", interrupted)
    spec = load_spec(QUICKSTART, ["trainer.steps=2", f"tracking.uri={store}"])
    with pytest.raises(InterruptedBeforeRun, match="nothing was logged"):
        run_experiment(spec)


def test_a_damaged_mlflow_store_is_refused_in_one_line_naming_the_file(store, tmp_path, monkeypatch):
    """A 0-byte mlflow.db silently became a new empty store (its runs gone, their
    checkpoints orphaned); a truncated one gave a 275-line traceback on ``resume``."""
    from pipelines.tracking import Tracker
    from pipelines.tracking import store as store_module

    spec = load_spec(QUICKSTART, [*TINY, f"tracking.uri={store}"])
    tracker = Tracker(spec.tracking)
    run_id = tracker.start(spec)
    tracker.fail(KeyboardInterrupt())
    db = Path(store.removeprefix("sqlite:///"))
    (db.parent / "checkpoints" / run_id).mkdir(parents=True)
    good = db.read_bytes()
    for damage, fragment in [
        (b"", "is empty (0 bytes), but artifacts/ and checkpoints/ beside it still hold"),
        (good[: len(good) // 3], "is truncated"),
        (b"\0" * 8192 + good[8192:], "is not a SQLite database"),
    ]:
        db.write_bytes(damage)
        monkeypatch.setattr(store_module, "_opened", {})  # as in a new process
        done = CliRunner().invoke(cli_module.app, ["resume", run_id, "--uri", store])
        lines = [line for line in done.output.splitlines() if line.strip()]
        assert done.exit_code == 2 and len(lines) == 1 and fragment in lines[0], done.output
        assert str(db) in lines[0] and "restore it from a backup" in lines[0]
        assert db.read_bytes() == damage  # left as it was, for the user to restore
    db.write_bytes(good)
    monkeypatch.setattr(store_module, "_opened", {})
    assert MlflowClient(store).get_run(run_id).info.status == "KILLED"  # restored: all there
    fresh = tmp_path / "fresh" / "mlflow.db"  # a 0-byte file with nothing beside it: a new store cut off
    fresh.parent.mkdir()
    fresh.write_bytes(b"")
    assert open_store(f"sqlite:///{fresh}").search_experiments() == []


SIZE_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full disk with ENOSPC
resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))  # the store fits; a 9 MB checkpoint does not
sys.argv = ["asyncrlhf", *sys.argv[1:]]
from pipelines.cli import main
main()
"""


def test_a_checkpoint_that_cannot_be_written_fails_the_run_with_the_os_error_and_leaves_nothing(store, tmp_path):
    """On a full disk the real error (``torch.save … iostream error``) was masked and a
    2.5 MB partial checkpoint stayed. (On a 12 MiB tmpfs the same run now ends FAILED
    with ``[Errno 28] … No space left on device``; a file size limit stands in for it here.)"""
    script = tmp_path / "limited.py"
    script.write_text(SIZE_LIMITED)
    args = ["run", str(QUICKSTART), *[f"--set={o}" for o in [*TINY, "trainer.checkpoint_every=1"]]]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env(), timeout=patience(300)
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "run failed: OSError: [Errno 27] cannot write the checkpoint of step 1 in" in done.stderr
    assert "File too large" in done.stderr and "Traceback" not in done.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    assert run.info.status == "FAILED" and "File too large" in run.data.tags["error"]
    folder = Path(store.removeprefix("sqlite:///")).parent / "checkpoints" / run.info.run_id
    assert [p.name for p in folder.iterdir()] == [".lock"]  # no partial checkpoint, no temporary folder


def test_a_killed_checkpoint_writes_folder_is_removed_by_the_next_owner(tmp_path):
    from pipelines.run.checkpoint_store import Checkpoints

    store = Checkpoints(tmp_path)
    store.save({"steps_done": 4}, 4, "key")
    (tmp_path / ".step-000008.tmp-4242").mkdir()  # its writer was SIGKILLed
    with store.lock():
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "step-000004"]


def test_a_store_that_cannot_take_the_last_metrics_does_not_hide_why_the_run_failed(store, monkeypatch):
    from pipelines.tracking import Tracker

    spec = load_spec(QUICKSTART, [*TINY, f"tracking.uri={store}"])
    tracker = Tracker(spec.tracking)
    run_id = tracker.start(spec)
    tracker.on_metrics(1, {"loss/policy": 0.5})
    real = tracker.client.log_batch

    def full(run_id, metrics=(), **kwargs):  # type: ignore[no-untyped-def]
        if metrics:
            raise OSError(28, "No space left on device")
        return real(run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(tracker.client, "log_batch", full)
    with pytest.warns(UserWarning, match="the last metrics could not be logged"):
        tracker.fail(RuntimeError("the real cause"))
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["error"] == "RuntimeError: the real cause"
