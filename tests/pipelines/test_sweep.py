"""Sweeps on a real local Ray cluster into temporary MLflow and Optuna stores."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from pipelines.spec.files import SpecError
from pipelines.sweeps import default_storage, load_sweep, run_sweep
from pipelines.sweeps.report import SweepReport
from pipelines.sweeps.spec import SweepSpec, choice_label, choice_value
from tests.helpers import patience
from tests.pipelines.conftest import REPO, cli, env

QUICKSTART = str(REPO / "experiments" / "quickstart.yaml")
SHORT = [
    "trainer.steps=4",
    "trainer.batch_size=32",
    "orchestrator.eval_every=2",
    "task.eval_size=20",
    "runtime.torch_threads=1",
]


def write_sweep(tmp_path: Path, **fields) -> Path:  # type: ignore[no-untyped-def]
    data = {"name": "test_sweep", "base": QUICKSTART, "overrides": SHORT, "parallel": 2, **fields}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep_runs(uri: str, experiment: str = "sweeps") -> tuple[object, list]:
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1  # every other run is a child of the one parent
    return parent, sorted(children, key=lambda r: int(r.data.tags["sweep.trial"]))


def trial_states(uri: str) -> list[str]:
    from pipelines.tracking.store import open_store

    client = open_store(uri)  # under the store's lock: the sweep may be creating it just now
    experiment = client.get_experiment_by_name("sweeps")
    runs = [] if experiment is None else client.search_runs([experiment.experiment_id])
    return [r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags]


def summary_files(uri: str, run_id: str) -> set[str]:
    return {a.path for a in MlflowClient(uri).list_artifacts(run_id, "summary")}


@pytest.mark.nightly  # CI: a sweep through the CLI stopped and resumed (the interrupted-trial test)
def test_a_grid_sweep_through_the_cli_with_a_second_driver_and_a_sigterm(store, tmp_path):
    """Two copies of a sweep at once used to corrupt each other (the second took the
    first's live trial for stale); SIGTERM used to abort it (exit 134) after its
    bookkeeping. Now: the second refuses, SIGTERM stops the first like Ctrl-C, and the
    same command resumes it to completion."""
    path = write_sweep(
        tmp_path,
        name="grid",
        method="grid",
        parallel=1,
        overrides=[*SHORT, "orchestrator.mode=lagged", "orchestrator.lag=0"],
        space={"orchestrator.lag": [0, 2], "algorithm.name": ["grpo", "m2po"]},
    )
    db = Path(default_storage(store).removeprefix("sqlite:///"))
    first = subprocess.Popen(
        [*cli(), "sweep", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    owner = db.with_name(f"{db.name}.grid.owner")
    while not owner.exists():
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.05)
    second = subprocess.run([*cli(), "sweep", str(path)], capture_output=True, text=True, env=env(), timeout=120)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
    assert f"is being run by pid {first.pid}" in lines[0]
    while "FINISHED" not in trial_states(store):
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=patience(120))
    assert first.returncode == 143 and "run the same command again to resume" in stderr, stderr[-3000:]
    parent, children = sweep_runs(store)
    assert parent.info.status == "KILLED" and "RUNNING" not in {c.info.status for c in children}, [
        (c.info.run_name, c.info.status, c.data.tags.get("asyncrlhf.status")) for c in children
    ]
    study = optuna.load_study(study_name="grid", storage=default_storage(store))
    assert [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING] == []
    assert not owner.exists()  # the lock is given back

    done = subprocess.run([*cli(), "sweep", str(path)], capture_output=True, text=True, env=env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "complete." in done.stdout and "trials by eval/accuracy" in done.stdout
    parent, children = sweep_runs(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.status"] == "complete"
    children = [c for c in children if c.info.status == "FINISHED"]  # those cut off by the SIGTERM are KILLED
    for child in children:  # named by their swept values
        lag, algorithm = child.data.params["orchestrator.lag"], child.data.params["algorithm.name"]
        assert sorted(child.info.run_name.split("·")) == sorted([algorithm, f"lag={lag}"])
        description = f"A trial of sweep grid: algorithm.name={algorithm}, orchestrator.lag={lag}."  # space order
        assert child.data.tags["mlflow.note.content"] == description
    combos = [(c.data.params["orchestrator.lag"], c.data.params["algorithm.name"]) for c in children]
    assert sorted(combos) == [("0", "grpo"), ("0", "m2po"), ("2", "grpo"), ("2", "m2po")]
    for child in children:  # the tag of swept values and the full spec agree
        swept = json.loads(child.data.tags["sweep.params"])
        assert str(swept["orchestrator.lag"]) == child.data.params["orchestrator.lag"]
        assert child.data.params["orchestrator.mode"] == "lagged" and child.data.params["trainer.steps"] == "4"
        assert "eval/accuracy" in child.data.metrics and "plots/curves.png" in {
            a.path for a in MlflowClient(store).list_artifacts(child.info.run_id, "plots")
        }
        # Each evaluation's table, as a tracked run logs it (once per step, also after a resume).
        table = MlflowClient(store).download_artifacts(child.info.run_id, "eval/samples.json", str(tmp_path))
        steps = [row[1] for row in json.loads(Path(table).read_text())["data"]]
        assert steps == [4] * 20 + [2] * 20 + [0] * 20  # 20 held-out problems at steps 0, 2, 4, newest first
    summary = {
        "summary/trials.md",
        "summary/trials.csv",
        "summary/objective_vs_params.png",
        "summary/objective_vs_staleness.png",
        "summary/curves_by_staleness.png",
    }
    assert summary <= summary_files(store, parent.info.run_id)
    assert parent.data.metrics["sweep/complete"] == 4
    # A damaged optuna.db was a ~300-line traceback; a deleted one reran every trial under
    # a second parent. Each is one line naming the file, and nothing runs.
    good, before = db.read_bytes(), len(sweep_runs(store)[1])
    for damage, fragment in [
        (good[: len(good) // 2], "is truncated"),
        (b"x" * 4096, "is not a SQLite database"),
        (None, "has no study in"),
    ]:
        db.unlink()
        if damage is not None:
            db.write_bytes(damage)
        refused = subprocess.run([*cli(), "sweep", str(path)], capture_output=True, text=True, env=env(), timeout=120)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 2 and len(lines) == 1 and fragment in lines[0], refused.stderr[-2000:]
        assert str(db) in lines[0]
    assert len(sweep_runs(store)[1]) == before  # no trial ran


def test_bad_sweep_files_fail_before_anything_runs(store, tmp_path):
    bad = write_sweep(tmp_path, method="grid", space={"orchestrator.lagg": [0, 1]})
    done = subprocess.run([*cli(), "sweep", str(bad)], capture_output=True, text=True, env=env())
    assert done.returncode == 2 and "orchestrator.lagg" in done.stderr
    with pytest.raises(SpecError, match="grid sweeps need lists"):
        load_sweep(write_sweep(tmp_path, method="grid", space={"trainer.lr": {"low": 1e-4, "high": 1e-3}}))
    with pytest.raises(SpecError, match="optuna sweeps need trials"):
        load_sweep(write_sweep(tmp_path, method="optuna", space={"trainer.lr": [1e-4]}))
    for name in ("a/b", "x" * 251):  # a '/' gave an MlflowException traceback, as did a 5,000-character name
        path = tmp_path / "named.yaml"
        path.write_text(yaml.safe_dump({"name": name, "base": QUICKSTART, "space": {"trainer.lr": [1e-4]}}))
        with pytest.raises(SpecError, match="name: String should"):
            load_sweep(path)
    assert not Path(store.removeprefix("sqlite:///")).exists()  # no run, no study


OPTUNA_SPACE = {
    "trainer.lr": {"low": 1e-4, "high": 1e-3, "log": True},
    "algorithm.clip_eps": {"low": 0.1, "high": 0.3},
    "rollout.group_size": [4, 8],
}


@pytest.mark.usefixtures("ray_cluster")
def test_an_optuna_sweep_runs_four_trials_in_parallel(store, tmp_path):
    sweep, base = load_sweep(
        write_sweep(tmp_path, name="tune", method="optuna", trials=4, space=OPTUNA_SPACE, pruner={"kind": "none"})
    )
    result = run_sweep(sweep, base, poll_s=0.2)
    assert result.complete and result.ran == 4 and [r["state"] for r in result.rows] == ["COMPLETE"] * 4
    values = [r["value"] for r in result.rows]
    assert values == sorted(values, reverse=True)  # best first
    parent, children = sweep_runs(store)
    assert [c.info.status for c in children] == ["FINISHED"] * 4
    for row, child in zip(sorted(result.rows, key=lambda r: r["number"]), children, strict=True):
        assert row["run_id"] == child.info.run_id
        lr = float(child.data.params["trainer.lr"])
        assert 1e-4 <= lr <= 1e-3 and lr == pytest.approx(row["params"]["trainer.lr"])
        assert child.data.params["rollout.group_size"] == str(row["params"]["rollout.group_size"])
        assert child.data.metrics["eval/accuracy"] == pytest.approx(row["value"])
    assert {"summary/trials.md", "summary/objective_vs_params.png"} <= summary_files(store, parent.info.run_id)
    # The study lives in SQLite beside the MLflow store.
    study = optuna.load_study(study_name="tune", storage=default_storage(store))
    assert len(study.trials) == 4 and all(len(t.intermediate_values) == 2 for t in study.trials)


@pytest.mark.usefixtures("ray_cluster")
def test_an_interrupted_optuna_sweep_resumes_without_rerunning(store, tmp_path):
    # No pruning: whether the median pruner stops a trial depends on learning values,
    # which is not what this test is about.
    sweep, base = load_sweep(
        write_sweep(
            tmp_path, name="resume", method="optuna", trials=4, space=OPTUNA_SPACE, parallel=1, pruner={"kind": "none"}
        )
    )
    first = run_sweep(sweep, base, max_trials=2, poll_s=0.2)
    assert first.ran == 2 and not first.complete
    kept = {r["number"]: (r["run_id"], r["value"], r["params"]) for r in first.rows}
    # A driver killed mid-trial leaves a RUNNING trial behind.
    storage = default_storage(store)
    study = optuna.load_study(study_name="resume", storage=storage)
    lost = study.ask()
    lost_params = {
        "trainer.lr": lost.suggest_float("trainer.lr", 1e-4, 1e-3, log=True),
        "algorithm.clip_eps": lost.suggest_float("algorithm.clip_eps", 0.1, 0.3),
        "rollout.group_size": lost.suggest_categorical("rollout.group_size", [4, 8]),
    }

    second = run_sweep(sweep, base, poll_s=0.2)
    assert second.complete and second.ran == 2 and len(second.rows) == 4
    again = {r["number"]: (r["run_id"], r["value"], r["params"]) for r in second.rows}
    assert all(again[n] == kept[n] for n in kept)  # finished trials kept as they were
    study = optuna.load_study(study_name="resume", storage=storage)
    interrupted = study.trials[lost.number]
    assert interrupted.state.name == "FAIL" and lost.number in study.user_attrs["interrupted"]
    rerun = [t for t in study.trials if t.number > lost.number and t.params == lost_params]
    assert len(rerun) == 1 and rerun[0].state.name == "COMPLETE"  # its parameters queued again and run
    assert len(study.trials) == 5  # 2 + the interrupted one + 2, nothing rerun twice
    parent, children = sweep_runs(store)
    assert parent.info.run_id == first.parent_run_id == second.parent_run_id
    assert len(children) == 4 and parent.data.tags["sweep.status"] == "complete"


@pytest.mark.nightly  # a 60-step grid for one pruned trial
@pytest.mark.usefixtures("ray_cluster")
def test_the_median_pruner_stops_an_obviously_bad_trial(store, tmp_path):
    # Two sane learning rates complete first; lr = 0.5 wrecks the policy in one step.
    sweep, base = load_sweep(
        write_sweep(
            tmp_path,
            name="prune",
            method="grid",
            parallel=1,
            space={"trainer.lr": [3e-4, 2e-4, 0.5]},
            overrides=[*SHORT, "trainer.steps=60", "orchestrator.eval_every=1"],
            pruner={"kind": "median", "n_startup_trials": 2},
        )
    )
    result = run_sweep(sweep, base, poll_s=0.05)
    states = {r["params"]["trainer.lr"]: r for r in result.rows}
    assert states[3e-4]["state"] == states[2e-4]["state"] == "COMPLETE"
    assert states[0.5]["state"] == "PRUNED" and states[0.5]["last_step"] < 60
    _, children = sweep_runs(store)
    pruned = next(c for c in children if c.data.params["trainer.lr"] == "0.5")
    assert pruned.info.status == "KILLED" and pruned.data.tags["asyncrlhf.status"] == "pruned"


@pytest.mark.usefixtures("ray_cluster")
def test_failing_trials_are_recorded_and_the_sweep_goes_on(store, tmp_path):
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes validation, fails to load in the trial
    sweep, base = load_sweep(
        write_sweep(
            tmp_path,
            name="failing",
            method="grid",
            overrides=[*SHORT, f"model.path={broken}"],
            space={"model.kind": ["tiny", "pretrained"], "trainer.batch_size": [32, 36]},
        )
    )
    result = run_sweep(sweep, base, poll_s=0.2)
    states = {(r["params"]["model.kind"], r["params"]["trainer.batch_size"]): r for r in result.rows}
    assert states["tiny", 32]["state"] == "COMPLETE"
    assert states["pretrained", 32]["state"] == "FAIL" and states["pretrained", 32]["error"]
    assert "not a multiple" in states["tiny", 36]["error"]  # invalid combination: failed at launch
    parent, children = sweep_runs(store)
    assert sorted(c.info.status for c in children) == ["FAILED", "FAILED", "FAILED", "FINISHED"]
    assert parent.data.metrics["sweep/fail"] == 3 and result.complete


@pytest.mark.parametrize(
    ("seeds", "fragment"),
    [([], "seeds: empty list"), ([0, 1, 0], "duplicate seeds [0]"), ([-1], "every seed must be ≥ 0")],
)
def test_bad_seed_axes_exit_2_with_one_line_and_create_nothing(store, tmp_path, seeds, fragment):
    bad = write_sweep(tmp_path, method="grid", space={"trainer.lr": [1e-4]}, seeds=seeds)
    done = subprocess.run([*cli(), "sweep", str(bad)], capture_output=True, text=True, env=env())
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
    assert not Path(store.removeprefix("sqlite:///")).exists()  # no run, no study


def test_a_seed_axis_also_in_the_space_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"space\.seed and seeds"):
        load_sweep(write_sweep(tmp_path, method="grid", space={"seed": [0, 1]}, seeds=[0, 1]))


@pytest.mark.usefixtures("ray_cluster")
def test_a_seeded_sweep_summarises_each_configuration_over_its_seeds(store, tmp_path):
    sweep, base = load_sweep(
        write_sweep(tmp_path, name="seeded", method="grid", seeds=[0, 1], space={"trainer.lr": [3e-4, 1e-4]})
    )
    result = run_sweep(sweep, base, poll_s=0.2)
    assert result.complete and result.ran == 2 and [r["state"] for r in result.rows] == ["COMPLETE"] * 2
    parent, children = sweep_runs(store)
    assert len(children) == 4 and {c.info.status for c in children} == {"FINISHED"}
    finals = {
        (c.data.params["trainer.lr"], c.data.tags["sweep.seed"]): c.data.metrics["eval/accuracy"] for c in children
    }
    assert {seed for _, seed in finals} == {"0", "1"} and {c.data.params["seed"] for c in children} == {"0", "1"}
    for row in result.rows:
        lr = str(row["params"]["trainer.lr"])
        values = [finals[lr, "0"], finals[lr, "1"]]
        assert row["seed_values"] == {0: values[0], 1: values[1]} and row["n"] == 2
        assert row["value"] == pytest.approx(sum(values) / 2)  # Optuna's value: the seed mean
        spread = abs(values[0] - values[1]) / 2**0.5  # sample std of two values
        assert row["std"] == pytest.approx(spread) and row["ci95"] == pytest.approx(
            12.7062047 * spread / 2**0.5
        )  # t(0.975; 1)
    client = MlflowClient(store)
    assert {
        "summary/trials.md",
        "summary/trials.csv",
        "summary/trials.json",
        "summary/objective_vs_params.png",
    } <= summary_files(store, parent.info.run_id)

    def artifact(name: str) -> str:
        return Path(client.download_artifacts(parent.info.run_id, f"summary/{name}", str(tmp_path))).read_text()

    table = artifact("trials.md")
    assert "mean ± 95% CI" in table and "(n=2)" in table and "seeds [0, 1]" in table
    rows = json.loads(artifact("trials.json"))
    assert [r["n"] for r in rows] == [2, 2] and all(r["ci95"] is not None for r in rows)


def test_in_flight_arms_sit_at_their_measured_per_token_staleness(store, tmp_path):
    """The study's in-flight arm: null (whole sequences) beside a mapping of switches; the
    staleness table puts each cell at its runs' mean staleness/token_mean."""
    from pipelines.sweeps import staleness_table

    space = {"orchestrator.lag": [2], "orchestrator.inflight": [None, {"label": "switch", "switch_at": [1, 2]}]}
    overrides = [*SHORT, "trainer.steps=6", "orchestrator.mode=lagged", "orchestrator.lag=2"]
    sweep, base = load_sweep(write_sweep(tmp_path, name="arms", method="grid", overrides=overrides, space=space))
    assert choice_label(None) == "none" and choice_value(sweep.space["orchestrator.inflight"], "none") is None
    result = run_sweep(sweep, base, poll_s=0.2)
    assert result.complete and [r["state"] for r in result.rows] == ["COMPLETE"] * 2
    table = staleness_table(sweep, result.rows)
    (whole,), (switched,) = table["eval/accuracy · none"], table["eval/accuracy · switch"]
    # whole sequences: the first steps train fresher data (version max(0, n − 2)), then 2
    assert 1.0 < whole < 2.0 and 0.0 < switched < whole  # the switches make tokens fresher
    head, cells = SweepReport(sweep, result.rows).display()  # the table shows where each trial sits
    shown = {row[head.index("orchestrator.inflight")]: float(row[head.index("token staleness")]) for row in cells}
    assert shown == {"none": round(whole, 2), "switch": round(switched, 2)}
    _, children = sweep_runs(store)
    configs = {c.data.tags["sweep.config"]: c.data.params for c in children}
    assert sorted(configs) == ["inflight=none·lag=2", "inflight=switch·lag=2"], sorted(configs)
    assert configs["inflight=switch·lag=2"]["orchestrator.inflight.switch_at"] == "[1, 2]"
    assert "orchestrator.inflight.switch_at" not in configs["inflight=none·lag=2"]


@pytest.mark.slow
def test_an_interrupted_trial_continues_from_its_checkpoint_when_the_sweep_runs_again(store, tmp_path):
    path = write_sweep(
        tmp_path,
        name="cut",
        method="grid",
        parallel=1,
        space={"trainer.lr": [3e-4]},
        overrides=[*SHORT, "trainer.steps=150", "trainer.checkpoint_every=10"],
    )
    process = subprocess.Popen(
        [*cli(), "sweep", str(path)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    checkpoints = Path(store.removeprefix("sqlite:///")).parent / "checkpoints"
    deadline = time.monotonic() + 300
    while not list(checkpoints.glob("*/step-*")) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-2000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=patience(120))
    assert process.returncode == 130, stderr[-2000:]
    _, (cut,) = sweep_runs(store)
    assert cut.info.status == "KILLED"
    done = subprocess.run([*cli(), "sweep", str(path)], capture_output=True, text=True, env=env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    parent, (child,) = sweep_runs(store)  # the same child run, continued: no second one
    assert child.info.run_id == cut.info.run_id and child.info.status == "FINISHED"
    assert child.data.tags["resume.count"] == "1" and parent.data.metrics["sweep/resumed_runs"] == 1
    steps = [m.step for m in MlflowClient(store).get_metric_history(child.info.run_id, "loss/policy")]
    assert sorted(steps) == list(range(1, 151))  # every step once, across the interruption


def test_a_float_range_over_an_integer_field_samples_integers(tmp_path):
    space = {"trainer.steps": {"low": 10, "high": 20}}
    sweep, _ = load_sweep(write_sweep(tmp_path, method="optuna", trials=2, space=space))
    assert sweep.space["trainer.steps"].type == "int"


def test_a_resumed_study_does_not_draw_trial_0_again(store, tmp_path):
    from pipelines.sweeps.study import make_study, suggest

    sweep, base = load_sweep(write_sweep(tmp_path, name="reseed", method="optuna", trials=10, space=OPTUNA_SPACE))
    Path(store.removeprefix("sqlite:///")).parent.mkdir(parents=True)
    storage = default_storage(store)

    def draw(study):  # type: ignore[no-untyped-def]
        trial = study.ask()
        params = {key: suggest(trial, key, values) for key, values in sweep.space.items()}
        study.tell(trial, 0.5)
        return params

    first = make_study(sweep, base, storage)
    drawn = [draw(first), draw(first)]
    resumed = make_study(sweep, base, storage)  # a new process: the sampler is built again
    assert draw(resumed) not in drawn


@pytest.mark.nightly  # CI: failing trials are recorded (test_failing_trials_…)
def test_a_sweep_where_no_trial_completes_fails(store, tmp_path):
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes validation, fails to load in every trial
    path = write_sweep(
        tmp_path,
        name="hopeless",
        method="grid",
        overrides=[*SHORT, f"model.path={broken}"],
        space={"model.kind": ["pretrained"]},
    )
    done = subprocess.run([*cli(), "sweep", str(path)], capture_output=True, text=True, env=env(), timeout=600)
    assert done.returncode == 1 and "no trial completed" in done.stderr, done.stderr[-2000:]
    parent, children = sweep_runs(store)
    assert parent.info.status == "FAILED" and parent.data.tags["sweep.status"] == "failed"
    assert [c.info.status for c in children] == ["FAILED"]


def test_the_staleness_study_sweeps_whole_algorithm_sections_and_has_a_quick_variant(tmp_path):
    study = REPO / "experiments" / "staleness_study.yaml"
    full, base = load_sweep(study)
    quick, quick_base = load_sweep(study, quick=True)
    assert (full.name, full.seeds, full.num_trials) == ("staleness_study", [0, 1, 2], 20)
    assert (quick.name, quick.seeds, quick.num_trials) == ("staleness_study_quick", [0, 1, 2], 20)
    assert quick_base["trainer"]["steps"] == 100 and base["trainer"]["steps"] == 600  # addition.yaml's
    control, control_base = load_sweep(REPO / "experiments" / "staleness_control.yaml")
    assert (control.seeds, list(control.space["orchestrator.lag"])) == ([0, 1, 2], [0, 4, 16, 64])
    assert (control_base["trainer"]["lr"], control_base["trainer"]["mini_batches"]) == (3e-4, 1)
    # A section given as a mapping is suggested by its label and sets the whole section.
    labels = [choice_label(v) for v in full.space["algorithm"]]
    assert labels == ["grpo", "m2po_trust_region", "m2po_batch", "decoupled_ppo", "no_trust_region"]
    assert choice_value(full.space["algorithm"], "m2po_trust_region") == {"name": "m2po", "m2_mode": "trust_region"}
    bad = write_sweep(tmp_path, space={"algorithm": [{"name": "grpo"}, {"name": "grpo"}]})
    with pytest.raises(SpecError, match=r"two choices labelled \['grpo'\]"):
        load_sweep(bad)
    with pytest.raises(SpecError, match="--quick, but the sweep has no 'quick' overrides"):
        load_sweep(bad, quick=True)


def test_a_bad_range_names_the_field_without_pydantic_internals(tmp_path):
    bad = write_sweep(tmp_path, method="optuna", trials=2, space={"trainer.lr": {"low": 1e-4, "high": -1}})
    with pytest.raises(SpecError) as caught:
        load_sweep(bad)
    assert "space.trainer.lr: low=0.0001 must be below high=-1.0" in str(caught.value)
    assert "function-after" not in str(caught.value) and "valid list" not in str(caught.value)


def test_a_trial_cut_off_before_suggesting_is_queued_again_with_its_fixed_values():
    """SIGTERM can land in ``study.ask()`` after Optuna opened the trial (a grid point,
    its values only in ``fixed_params``) but before the driver registered it: once such a
    trial was left RUNNING, and its empty ``params`` would have been queued again."""
    from pipelines.sweeps import runs as runs_mod

    study = optuna.create_study()
    study.enqueue_trial({"orchestrator.lag": 2})
    cut = study.ask()  # opened, nothing suggested yet
    assert cut.params == {} and study.trials[0].state.name == "RUNNING"
    runs_mod.interrupt_stale(study, client=None)  # no MLflow runs to end
    assert study.trials[0].state.name == "FAIL" and study.user_attrs["interrupted"] == [0]
    again = study.ask()
    assert again.suggest_categorical("orchestrator.lag", [0, 2]) == 2


@pytest.mark.usefixtures("ray_cluster")
def test_an_interrupt_while_a_trials_run_is_being_created_leaves_no_run_open(store, tmp_path, monkeypatch):
    """SIGTERM (here: Ctrl-C) can land in ``Tracker.start`` after MLflow created the run
    but before its trial recorded the run id: once that run stayed RUNNING forever."""
    from pipelines.tracking import Tracker

    def cut_off(self, resumed):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(Tracker, "_monitor_system", cut_off)  # just after create_run
    sweep, base = load_sweep(write_sweep(tmp_path, method="grid", space={"orchestrator.lag": [0, 1]}))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, base, poll_s=0.2)
    parent, children = sweep_runs(store)
    assert parent.info.status == "KILLED" and children
    # the tracker now ends its own run (its creation is shielded, the rest inside failing())
    assert {(c.info.status, c.data.tags["asyncrlhf.status"]) for c in children} == {("KILLED", "killed")}


def test_a_stop_just_after_a_trial_was_told_leaves_it_complete():
    """SIGTERM can land in the driver between ``study.tell`` and forgetting the trial: its
    interrupt then tried to fail a COMPLETE trial (optuna: "Cannot tell a COMPLETE trial")
    and the sweep exited 1 instead of stopping cleanly."""
    from pipelines.sweeps import study as studies

    study = optuna.create_study()
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study.tell(trial, 0.5)
    studies.interrupt(study, trial.number, trial.params)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] and "interrupted" not in study.user_attrs


@pytest.mark.nightly  # a race's regression test
@pytest.mark.usefixtures("ray_cluster")
def test_a_stop_after_a_trials_run_finished_but_before_its_tell_keeps_its_result(store, tmp_path, monkeypatch):
    """SIGTERM can land after a trial's run FINISHED in MLflow but before Optuna was told:
    the interrupt failed the trial and queued it again, and the resumed sweep ran it a
    second time (two FINISHED runs of one grid point, seen once in CI). Now the interrupt
    tells a trial whose every seed ended."""
    from pipelines.sweeps import driver

    real, calls = driver.Driver._tell, []

    def stopped_first(self, config):  # type: ignore[no-untyped-def]
        calls.append(config.trial.number)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self, config)

    monkeypatch.setattr(driver.Driver, "_tell", stopped_first)
    sweep, base = load_sweep(
        write_sweep(tmp_path, name="told", method="grid", parallel=1, space={"orchestrator.lag": [0, 1]})
    )
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, base, poll_s=0.2)
    study = optuna.load_study(study_name="told", storage=default_storage(store))
    assert calls == [0, 0] and [t.state.name for t in study.trials] == ["COMPLETE"]  # lag 1: not begun
    assert study.user_attrs["grid_next"] == 1  # nor enqueued: grid points go in one per ask
    monkeypatch.setattr(driver.Driver, "_tell", real)
    result = run_sweep(sweep, base, poll_s=0.2)
    assert result.complete and result.ran == 1 and [r["state"] for r in result.rows] == ["COMPLETE"] * 2
    _, children = sweep_runs(store)
    assert sorted((c.data.params["orchestrator.lag"], c.info.status) for c in children) == [
        ("0", "FINISHED"),
        ("1", "FINISHED"),
    ]


@pytest.mark.nightly  # a race's regression test
@pytest.mark.usefixtures("ray_cluster")
def test_a_seed_that_finished_before_a_stop_is_adopted_not_run_again(store, tmp_path, monkeypatch):
    """A configuration's seed 0 FINISHED, then the stop came before seed 1 ran: the
    queued trial takes seed 0's run over (renamed, retagged, its value and curve) and
    runs only seed 1."""
    from pipelines.tracking import Tracker

    real = Tracker.finish

    def stop_after(self, history):  # type: ignore[no-untyped-def]
        real(self, history)
        raise KeyboardInterrupt

    monkeypatch.setattr(Tracker, "finish", stop_after)
    sweep, base = load_sweep(
        write_sweep(tmp_path, name="adopt", method="grid", parallel=1, seeds=[0, 1], space={"trainer.lr": [3e-4]})
    )
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, base, poll_s=0.2)
    _, (first,) = sweep_runs(store)
    assert first.info.status == "FINISHED" and first.data.tags["sweep.seed"] == "0"
    monkeypatch.setattr(Tracker, "finish", real)
    result = run_sweep(sweep, base, poll_s=0.2)
    (row,) = result.rows
    parent, children = sweep_runs(store)
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    by_seed = {c.data.tags["sweep.seed"]: c for c in children}
    adopted = by_seed["0"]
    assert adopted.info.run_id == first.info.run_id and adopted.data.tags["sweep.trial"] == str(row["number"]) == "1"
    assert adopted.info.run_name == "lr=3e-4·s0" and by_seed["1"].info.run_name == "lr=3e-4·s1"
    assert adopted.data.tags["mlflow.runColor"] == by_seed["1"].data.tags["mlflow.runColor"]  # one configuration
    finals = [by_seed[s].data.metrics["eval/accuracy"] for s in ("0", "1")]
    assert row["state"] == "COMPLETE" and row["seed_values"] == {0: finals[0], 1: finals[1]}
    assert row["value"] == pytest.approx(sum(finals) / 2) and parent.data.tags["sweep.status"] == "complete"


def test_a_million_point_grid_starts_its_first_trials_at_once(tmp_path):
    """Every point used to be enqueued up front, each checked against all before it:
    1,162 of 10⁶ after 120 s, and no trial started. Points now go in one per ask."""
    from pipelines.sweeps.study import enqueue_grid_point, make_study

    space = {f"axis{i}": list(range(10)) for i in range(6)}  # 10⁶ points (checked against no base here)
    sweep = SweepSpec.model_validate({"name": "huge", "base": "quickstart.yaml", "space": space})
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    start = time.monotonic()
    study = make_study(sweep, {}, storage)
    asked = []
    for _ in range(3):
        enqueue_grid_point(sweep, study)
        trial = study.ask()
        asked.append({key: trial.suggest_categorical(key, values) for key, values in space.items()})
    assert time.monotonic() - start < 30 and sweep.num_trials == 10**6
    assert asked == [{**dict.fromkeys(space, 0), "axis5": last} for last in (0, 1, 2)]  # the grid's own order
    assert len(study.get_trials(deepcopy=False)) == 3
    reopened = make_study(sweep, {}, storage)  # a resumed sweep continues where it was
    enqueue_grid_point(sweep, reopened)
    assert reopened.ask().params == {} and reopened.user_attrs["grid_next"] == 4


def test_a_grid_point_enqueued_but_not_counted_before_a_kill_runs_once(tmp_path, monkeypatch):
    """A fresh-clone CI run: the driver stopped between enqueueing a grid point and counting
    it (a SIGTERM then; a SIGKILL can still), so the resumed sweep ran the waiting point,
    enqueued it again, ran it twice and never ran the grid's last point. The enqueued trial
    carries its point's index, and a reopened study counts it from there."""
    from pipelines.sweeps import study as studies

    space = {"orchestrator.lag": [0, 2], "algorithm.name": ["grpo", "m2po"]}
    sweep = SweepSpec.model_validate({"name": "torn", "base": "quickstart.yaml", "method": "grid", "space": space})
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    asked: list[tuple[Any, ...]] = []

    def next_trial(study: Any) -> None:
        studies.enqueue_grid_point(sweep, study)
        trial = study.ask()
        asked.append(tuple(studies.suggest(trial, key, values) for key, values in space.items()))
        study.tell(trial, 0.5)

    study = studies.make_study(sweep, {}, storage)
    next_trial(study)
    next_trial(study)
    real = study.set_user_attr

    def killed_before_counting(key: str, value: Any) -> None:
        if key == studies.GRID_NEXT:
            raise SystemExit("killed")  # the third point is enqueued, never counted
        real(key, value)

    monkeypatch.setattr(study, "set_user_attr", killed_before_counting)
    with pytest.raises(SystemExit):
        studies.enqueue_grid_point(sweep, study)
    resumed = studies.make_study(sweep, {}, storage)
    while len(studies.counted(resumed)) < sweep.num_trials:
        next_trial(resumed)
    assert asked == [(0, "grpo"), (0, "m2po"), (2, "grpo"), (2, "m2po")]  # each point once, in order
    assert resumed.user_attrs[studies.GRID_NEXT] == 4


def test_a_reopened_parent_run_drops_the_error_of_its_last_stop(store, tmp_path):
    """A resumed sweep's FINISHED parent kept the ``error`` tag of the stop before."""
    from pipelines.sweeps.runs import parent_run
    from pipelines.tracking.store import end_run

    sweep, _ = load_sweep(write_sweep(tmp_path, name="reopened", method="grid", space={"orchestrator.lag": [0, 1]}))
    study, client = optuna.create_study(), MlflowClient(store)
    first = parent_run(client, sweep, study, "memory")
    end_run(client, first, "KILLED", "killed", {"error": "reconciled: its process is gone"})
    assert parent_run(client, sweep, study, "memory") == first
    run = client.get_run(first)
    assert run.info.status == "RUNNING" and "error" not in run.data.tags


def test_sweep_set_overrides_the_base_experiment_too(tmp_path):
    """``asyncrlhf sweep … --set trainer.steps=20`` was refused (``trainer: unknown key``):
    shortening a sweep meant rewriting its whole overrides list."""
    path = write_sweep(tmp_path, name="shorter", method="grid", space={"orchestrator.lag": [0, 1]})
    sweep, base = load_sweep(path, ["trainer.steps=20", "parallel=1", "seed=3"])
    assert sweep.parallel == 1 and sweep.seed == 3  # the sweep's own fields
    assert base["trainer"]["steps"] == 20 and sweep.overrides[-1] == "trainer.steps=20"  # after the file's own
    with pytest.raises(SpecError, match=r"trainer\.stepz"):
        load_sweep(path, ["trainer.stepz=20"])
