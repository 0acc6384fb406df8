"""Checkpoints and resume through the real CLI, a real MLflow store and real signals."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from pipelines.run.checkpoint_store import Checkpoints
from tests.helpers import patience
from tests.pipelines.conftest import cli, env

SPEC = {
    "name": "resume",
    "rollout": {"group_size": 8, "max_new_tokens": 5, "temperature": 0.7},
    "trainer": {"steps": 40, "batch_size": 64, "lr": 3.0e-4, "checkpoint_every": 4},
    "orchestrator": {"mode": "lagged", "lag": 1, "eval_every": 10},
    "runtime": {"torch_threads": 1},
    "tracking": {"experiment": "resume"},
}


def write_spec(tmp_path: Path, **sections) -> Path:  # type: ignore[no-untyped-def]
    data = {**SPEC, **sections}
    path = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*')))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def asyncrlhf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([*cli(), *args], capture_output=True, text=True, env=env(), timeout=timeout)


def runs(uri: str) -> list:  # type: ignore[type-arg]
    from pipelines.tracking.store import open_store

    client = open_store(uri)  # under the store's lock: a run starting may be creating it just now
    experiment = client.get_experiment_by_name("resume")
    return [] if experiment is None else client.search_runs([experiment.experiment_id], order_by=["start_time"])


def curve(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def policy_sha(uri: str, run_id: str, tmp_path: Path) -> str:
    folder = MlflowClient(uri).download_artifacts(run_id, "policy", str(tmp_path / run_id))
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()


def checkpoints(uri: str, run_id: str) -> Checkpoints:
    return Checkpoints(Path(uri.removeprefix("sqlite:///")).parent / "checkpoints" / run_id)


def start_run(spec: Path, uri: str) -> tuple[str, subprocess.Popen]:  # type: ignore[type-arg]
    """Start ``asyncrlhf run`` in a subprocess; its new MLflow run's id once it exists."""
    known = {r.info.run_id for r in runs(uri)}
    process = subprocess.Popen(
        [*cli(), "run", str(spec)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        new = [r.info.run_id for r in runs(uri) if r.info.run_id not in known]
        if new:
            return new[0], process
        assert process.poll() is None, process.communicate()[1][-2000:]
        time.sleep(0.05)
    process.kill()
    raise AssertionError("no run appeared")


def start_training(spec: Path, uri: str) -> tuple[str, subprocess.Popen]:  # type: ignore[type-arg]
    """:func:`start_run`, returning once the run's first metrics are flushed: it is training."""
    run_id, process = start_run(spec, uri)
    while not curve(uri, run_id, "loss/policy"):
        assert process.poll() is None, process.communicate()[1][-2000:]
        time.sleep(0.02)
    return run_id, process


RAY = {"kind": "ray", "num_cpus": 2, "torch_threads": 1, "rollout": {"num_cpus": 0.5}, "trainer": {"num_cpus": 1}}


def signal_after_checkpoint(run_id: str, process: subprocess.Popen, uri: str, sig: int) -> list[int]:  # type: ignore[type-arg]
    """Send ``sig`` as soon as the run has written a checkpoint; the steps checkpointed then."""
    store = checkpoints(uri, run_id)
    deadline = time.monotonic() + 240
    while not store.steps() and time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.01)
    process.send_signal(sig)
    process.wait(timeout=patience(120))
    return store.steps()


@pytest.mark.slow
def test_sigkill_then_resume_repeats_the_uninterrupted_lagged_run(store, tmp_path):
    spec = write_spec(tmp_path)
    done = asyncrlhf("run", str(spec))
    assert done.returncode == 0, done.stderr[-2000:]
    (reference,) = runs(store)
    run_id, process = start_run(spec, store)
    signal_after_checkpoint(run_id, process, store, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL and MlflowClient(store).get_run(run_id).info.status == "RUNNING"
    # The next command on the store finds the run's process gone and marks it KILLED
    # (here a refused resume: it opened the store, then exited 2).
    refused = asyncrlhf("resume", run_id, "--set", "trainer.steps=1")
    assert refused.returncode == 2 and "raise it" in refused.stderr
    killed = MlflowClient(store).get_run(run_id)
    assert killed.info.status == "KILLED"
    assert "ended without closing it (killed with SIGKILL" in killed.data.tags["error"]
    resumed = asyncrlhf("resume", run_id)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resume.count"] == "1" and "error" not in run.data.tags
    (from_step,) = json.loads(run.data.tags["resume.from_steps"])  # the newest checkpoint it reached
    assert 0 < from_step < 40 and from_step % 4 == 0
    for key in ("loss/policy", "reward/mean", "eval/accuracy", "staleness/max"):
        got, want = curve(store, run_id, key), curve(store, reference.info.run_id, key)
        assert [s for s, _ in got] == sorted({s for s, _ in got})  # no step logged twice
        assert got == want, key
    assert policy_sha(store, run_id, tmp_path) == policy_sha(store, reference.info.run_id, tmp_path)
    assert len(runs(store)) == 2  # the resume created no run
    got, want = (eval_table(store, r, tmp_path) for r in (run_id, reference.info.run_id))
    assert got == want and sorted({row[1] for row in got}) == [0, 10, 20, 30, 40]


def eval_table(uri: str, run_id: str, tmp_path: Path) -> list[list]:  # type: ignore[type-arg]
    path = MlflowClient(uri).download_artifacts(run_id, "eval/samples.json", str(tmp_path / f"table-{run_id}"))
    return json.loads(Path(path).read_text())["data"]


def test_a_resumed_run_does_not_log_an_evaluation_twice(store, tmp_path):
    """Killed after evaluating at step 10 but checkpointed at step 8, a run repeats the
    evaluation at step 10 when resumed: its rows are in the table once."""
    from pipelines.spec import load_spec
    from pipelines.tracking import Tracker

    spec = load_spec(write_spec(tmp_path))
    rows = {"problem": ["1+2="], "step": [0], "prompt": ["1+2="], "answer": ["3"], "output": ["4"], "correct": [False]}
    first = Tracker(spec.tracking)
    run_id = first.start(spec)
    for step in (0, 10):
        first.on_eval_rows(step, {**rows, "step": [step]})
    first.fail(KeyboardInterrupt())
    second = Tracker(spec.tracking)
    second.resume(run_id, from_step=8, restored=[])
    for step in (10, 20):
        second.on_eval_rows(step, {**rows, "step": [step]})
    second.fail(KeyboardInterrupt())
    assert [row[1] for row in eval_table(store, run_id, tmp_path)] == [20, 10, 0]  # once each, newest first


@pytest.mark.slow
def test_sigterm_checkpoints_and_marks_the_run_killed_then_a_finished_run_continues(store, tmp_path):
    spec = write_spec(tmp_path, trainer={**SPEC["trainer"], "checkpoint_every": 100})
    run_id, process = start_training(spec, store)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=patience(120))
    assert process.returncode == 143, stderr[-2000:]
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["asyncrlhf.status"] == "killed"
    (step,) = checkpoints(store, run_id).steps()  # written on the signal, not on schedule
    assert 10 <= step < 40 and "SIGTERM" in stderr
    assert asyncrlhf("resume", run_id).returncode == 0
    assert asyncrlhf("resume", run_id, "--set", "trainer.steps=48").returncode == 0
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resume.count"] == "2"
    assert [s for s, _ in curve(store, run_id, "loss/policy")] == list(range(1, 49))
    (first,) = json.loads(run.data.tags["resume.from_steps"])[1:]  # the finished run, continued from 40
    for key in FIGURES:  # once per process that finished: the continued run's at the step it began from
        assert [s for s, _ in curve(store, run_id, key)] == [0, first], key


def test_bad_resumes_exit_2_with_one_line_and_create_nothing(store, tmp_path, monkeypatch):
    """In process, through the real Typer app (the signal and kill tests above use the
    console script): each refusal is a CLI start-up saved."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    monkeypatch.setenv("COLUMNS", "400")
    spec = write_spec(tmp_path, trainer={**SPEC["trainer"], "steps": 4})
    assert CliRunner().invoke(app, ["run", str(spec)]).exit_code == 0
    (run,) = runs(store)
    for change, fragment in [
        (
            ["--set", "trainer.lr=1e-4"],
            "may change, but trainer.lr (0.0003 → 0.0001)",
        ),
        (["--set", "tracking.experiment=other"], "the run is in experiment 'resume'"),
        ([], "raise it (--set trainer.steps=8) to continue"),  # FINISHED, steps not raised
        (["--resume", "0123456789abcdef"], "no run '0123456789abcdef'"),
    ]:
        target = [] if "--resume" in change else ["--resume", run.info.run_id]
        done = CliRunner().invoke(app, ["run", str(spec), *target, *change])
        lines = [line for line in done.output.splitlines() if line.strip()]
        assert done.exit_code == 2 and len(lines) == 1 and fragment in lines[0], done.output
    assert [r.info.run_id for r in runs(store)] == [run.info.run_id]  # no run created
    assert MlflowClient(store).get_run(run.info.run_id).info.status == "FINISHED"  # nor reopened


def test_a_damaged_newest_checkpoint_falls_back_and_none_usable_is_a_clear_error(tmp_path):
    store = Checkpoints(tmp_path, keep=3)
    for step in (4, 8):
        store.save({"steps_done": step}, step, "key")
    (tmp_path / "step-000008" / "state.pt").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="step-000008 is unusable"):
        state, manifest = store.load_latest()
    assert state == {"steps_done": 4} and manifest["step"] == 4
    (tmp_path / "step-000004" / "state.pt").unlink()
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="no usable checkpoint"):
        store.load_latest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004", "step-000008"]  # nothing overwritten


def test_only_the_newest_checkpoints_are_kept_and_a_half_written_one_is_invisible(tmp_path):
    store = Checkpoints(tmp_path, keep=2)
    for step in (1, 2, 3):
        store.save({"steps_done": step}, step, "key")
    (tmp_path / ".step-000004.tmp-99").mkdir()  # a writer killed mid-checkpoint
    assert store.steps() == [2, 3] and store.load_latest()[0] == {"steps_done": 3}


@pytest.mark.nightly  # CI: SIGTERM to a local run; a stopped Ray run resumes (tests/distributed)
@pytest.mark.slow
def test_sigterm_to_a_ray_run_stops_it_like_ctrl_c(store, tmp_path):
    """ray.init replaces the driver's SIGTERM handler with sys.exit(15): the run used to end
    FAILED with ``SystemExit: 15`` and native stack dumps. Now it is checkpointed and KILLED."""
    spec = write_spec(tmp_path, runtime=RAY, trainer={**SPEC["trainer"], "steps": 400, "checkpoint_every": 100})
    run_id, process = start_training(spec, store)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=patience(120))
    assert process.returncode == 143, stderr[-2000:]
    assert "SystemExit" not in stderr and "Fatal Python error" not in stderr and "SIGTERM" in stderr
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["asyncrlhf.status"] == "killed"
    assert len(checkpoints(store, run_id).steps()) == 1  # written on the signal


def test_resume_refuses_an_edited_spec_yaml_unless_forced_and_a_garbled_one_in_one_line(store, tmp_path):
    """``sed -i 's/^  lr: .*/  lr: 0.5/' …/spec.yaml; asyncrlhf resume RID`` trained at lr 0.5
    while the params said 0.0003: the checkpoint's spec hash was checked only for sweeps.
    A garbled or empty spec.yaml gave a long traceback."""
    from typer.testing import CliRunner

    from pipelines.cli import app
    from pipelines.run import run_experiment
    from pipelines.spec import load_spec

    spec = load_spec(write_spec(tmp_path), ["trainer.steps=8", "orchestrator.eval_every=0", f"tracking.uri={store}"])
    run_id = run_experiment(spec).run_id
    artifact = Path(MlflowClient(store).get_run(run_id).info.artifact_uri.removeprefix("file://")) / "spec.yaml"
    original = artifact.read_text()
    artifact.write_text(original.replace("lr: 0.0003", "lr: 0.5"))
    assert "lr: 0.5" in artifact.read_text()
    resume = ["resume", run_id, "--uri", store, "--set", "trainer.steps=12"]
    refused = CliRunner().invoke(app, resume)
    assert refused.exit_code == 2 and "trainer.lr (0.0003 → 0.5)" in refused.output and "--force" in refused.output
    assert checkpoints(store, run_id).steps()[-1] == 8  # nothing ran
    for text, message in (("trainer: {lr: [", "cannot be read (ParserError)"), ("", "is not a spec")):
        artifact.write_text(text)
        done = CliRunner().invoke(app, resume)
        assert done.exit_code == 2 and message in done.output and "Traceback" not in done.output, done.output
    artifact.write_text(original.replace("lr: 0.0003", "lr: 0.5"))
    with pytest.warns(UserWarning, match="resuming anyway"):
        forced = CliRunner().invoke(app, [*resume, "--force"])
    assert forced.exit_code == 0, forced.output
    assert checkpoints(store, run_id).steps()[-1] == 12


@pytest.mark.nightly  # CI: the other refusals (test_bad_resumes_…)
def test_resume_refuses_a_run_that_is_still_training(store, tmp_path):
    """``asyncrlhf resume RID`` while RID trained was accepted: both processes trained and
    logged into one run and one checkpoint folder (216 loss/policy rows for 150 steps)."""
    spec = write_spec(tmp_path, trainer={**SPEC["trainer"], "steps": 150})
    run_id, process = start_run(spec, store)
    try:
        folder = checkpoints(store, run_id)
        deadline = time.monotonic() + patience(240)
        while not folder.steps() and time.monotonic() < deadline:
            assert process.poll() is None, "the run ended before it could be resumed"
            time.sleep(0.05)
        refused = asyncrlhf("resume", run_id, "--uri", store, "--set", "trainer.steps=300")
        assert refused.returncode == 2 and "the run is still training in process" in refused.stderr, refused.stderr
        assert process.poll() is None  # the owner was left alone
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=patience(120))
    losses = curve(store, run_id, "loss/policy")
    assert len(losses) == len({step for step, _ in losses})  # one row per step: nobody else logged into it
    with folder.lock():  # another process holding the run's checkpoints, past the owner check
        held = asyncrlhf("resume", run_id, "--uri", store, "--set", "trainer.steps=300")
    assert held.returncode == 2 and "another process is training this run" in held.stderr, held.stderr


KILL_DURING_UPLOAD = """
import os, signal, sys
import pipelines.run.experiment as run
from pipelines.spec import load_spec

def killed(*args):  # SIGKILL while the final upload begins: metrics of the last steps unflushed
    os.kill(os.getpid(), signal.SIGKILL)

run._log_policy = killed
run.run_experiment(load_spec(sys.argv[1]))
"""

FIGURES = ("time/total_s", "perf/bubble_frac_trainer", "perf/checkpoint_frac", "perf/tracking_frac")


@pytest.mark.nightly  # CI: SIGKILL and SIGTERM, then resume (the tests above)
def test_a_run_killed_during_its_final_upload_is_finished_by_resume(store, tmp_path):
    """SIGKILL during the final upload left a KILLED run with no plots, history or policy,
    steps 57–60 lost, and ``resume`` saying raise ``trainer.steps``. Now resume finishes it,
    training nothing: every step once, as in the uninterrupted run, and the same policy."""
    import sys

    trainer = {**SPEC["trainer"], "steps": 12, "checkpoint_every": 4}
    spec = write_spec(tmp_path, trainer=trainer, tracking={**SPEC["tracking"], "flush_every": 5})
    assert asyncrlhf("run", str(spec)).returncode == 0
    (reference,) = runs(store)
    script = tmp_path / "kill.py"
    script.write_text(KILL_DURING_UPLOAD)
    killed = subprocess.run(
        [sys.executable, str(script), str(spec)], capture_output=True, text=True, env=env(), timeout=patience(300)
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run_id = runs(store)[-1].info.run_id
    assert checkpoints(store, run_id).steps()[-1] == 12
    assert [s for s, _ in curve(store, run_id, "loss/policy")] == list(range(1, 11))  # 11 and 12 unflushed
    resumed = asyncrlhf("resume", run_id)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and json.loads(run.data.tags["resume.from_steps"]) == [12]
    for key in ("loss/policy", "reward/mean", "eval/accuracy"):
        assert curve(store, run_id, key) == curve(store, reference.info.run_id, key), key
    for key in FIGURES:  # logged once, at step 0, as in a run that was not stopped
        assert [s for s, _ in curve(store, run_id, key)] == [0], key
    assert policy_sha(store, run_id, tmp_path) == policy_sha(store, reference.info.run_id, tmp_path)
    artifacts = {a.path for a in MlflowClient(store).list_artifacts(run_id, "plots")}
    assert {"plots/curves.png", "plots/staleness.png", "plots/timeline.png"} <= artifacts
    assert checkpoints(store, run_id).steps()[-1] == 12  # nothing trained, nothing rewritten
    again = asyncrlhf("resume", run_id)  # FINISHED now: nothing left to do
    assert again.returncode == 2 and "raise it" in again.stderr


@pytest.mark.nightly  # cleanup after a SIGKILL
@pytest.mark.slow
def test_a_sigkilled_ray_runs_cluster_ends_with_it(store, tmp_path):
    """After SIGKILL of a Ray run, Ray's dashboard and runtime-env agents lived on for up
    to a minute (they try to tell the dead GCS first). The run's watcher ends them."""
    import psutil

    spec = write_spec(tmp_path, runtime=RAY, trainer={**SPEC["trainer"], "steps": 4000, "checkpoint_every": 0})
    _, process = start_training(spec, store)
    family = psutil.Process(process.pid).children(recursive=True)
    names = " ".join(p.name() for p in family)
    assert "raylet" in names and "gcs_server" in names and "_reaper" in " ".join(" ".join(p.cmdline()) for p in family)
    process.kill()
    process.wait(timeout=30)

    def running() -> list[str]:
        alive = []
        for child in family:
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child.name())
            except psutil.NoSuchProcess:
                pass
        return alive

    deadline = time.monotonic() + patience(10)
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running() == [], running()
