from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from asyncrlhf.models import load_pretrained
from pipelines.run import run_experiment
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO, cli, env

QUICKSTART = REPO / "experiments" / "quickstart.yaml"
SHORT = [
    "--set",
    "trainer.steps=6",
    "--set",
    "trainer.batch_size=64",
    "--set",
    "orchestrator.eval_every=3",
    "--set",
    "task.eval_size=20",
]


def runs(uri: str) -> list:
    db = Path(uri.removeprefix("sqlite:///"))
    if not db.exists():
        return []
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(experiments)) if experiments else []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        # Through the installed console script; the README's bad-input table
        # (tests/pipelines/test_bad_input.py) covers the other inputs in-process.
        (["trainer.lr=fast"], "trainer.lr"),
        (["model.kind=pretrained", "model.path=/no/such/model"], "/no/such/model"),
        (["rewards=[{kind: nope}]"], "rewards.0.kind"),
    ],
)
def test_bad_specs_exit_non_zero_with_one_line_and_no_run(store, overrides, fragment):
    args = [a for o in overrides for a in ("--set", o)]
    done = subprocess.run([*cli(), "run", str(QUICKSTART), *args], capture_output=True, text=True, env=env())
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]
    assert runs(store) == []


def test_malformed_yaml_and_missing_file(store, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [oops\n")
    for path, fragment in [(bad, "malformed YAML"), (tmp_path / "none.yaml", "does not exist")]:
        done = subprocess.run([*cli(), "validate", str(path)], capture_output=True, text=True, env=env())
        assert done.returncode == 2 and fragment in done.stderr
    assert runs(store) == []


def test_run_through_the_cli_into_a_real_store(store, tmp_path, monkeypatch):
    done = subprocess.run([*cli(), "run", str(QUICKSTART), *SHORT], capture_output=True, text=True, env=env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "summary" in done.stdout and "asyncrlhf ui" in done.stdout
    (run,) = runs(store)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["trainer.steps"], params["algorithm.name"], params["orchestrator.mode"]) == ("6", "grpo", "lagged")
    # What differs is in the name; params are the knobs, bookkeeping is tags; the experiment
    # opens on its runs in MLflow 3's UI.
    # No knob changed: the base name, then how long, how big and how often while it fits 40 characters.
    assert run.info.run_name == "quickstart·steps=6·batch=64·eval_every=3"
    assert json.loads(run.data.tags["asyncrlhf.changed"]) == [o.split("=")[0] for o in SHORT[1::2]]
    assert run.data.tags["mlflow.runColor"] == "#1f77b4" and run.data.tags["mlflow.source.name"] == "asyncrlhf"
    assert not {"name", "description", "tracking.experiment", "tracking.run_name"} & set(params)
    assert run.data.tags["spec.name"] == "quickstart"
    assert run.data.tags["mlflow.note.content"].startswith("lagged GRPO (k = 1, rollout and training concurrent)")
    experiment = MlflowClient(store).get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.tags["mode"] == "lagged" and run.data.tags["algorithm"] == "grpo" and "spec_hash" in run.data.tags
    client = MlflowClient(store)
    for key in [
        "reward/mean",
        "loss/policy",
        "policy/clip_frac",
        "staleness/max",
        "buffer/size",
        "time/step_s",
        "perf/samples_per_s",
    ]:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3, 4, 5, 6], key
    accuracy = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert sorted(m.step for m in accuracy) == [0, 3, 6]
    # The start's accuracy is stamped when it was measured, before step 1 (it used to
    # carry the end-of-run time, so every time-axis curve fell back to it at the end).
    start = next(m for m in accuracy if m.step == 0)
    first = next(m for m in client.get_metric_history(run.info.run_id, "loss/policy") if m.step == 1)
    assert start.timestamp <= first.timestamp < run.info.end_time
    csv = Path(client.download_artifacts(run.info.run_id, "history/history.csv", str(tmp_path))).read_text()
    rows = [line.split(",") for line in csv.splitlines()]
    assert rows[0][0] == "step" and [r[0] for r in rows[1:]] == ["0", "1", "2", "3", "4", "5", "6"]
    assert rows[1][rows[0].index("eval/accuracy")] == repr(start.value)
    assert "perf/bubble_frac_trainer" in run.data.metrics and "perf/tracking_frac" in run.data.metrics
    # Whole-run figures are single values at step 0 (MLflow draws them as bars).
    for key in ["perf/bubble_frac_trainer", "perf/tracking_frac", "time/total_s"]:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0], key
    # The evaluation table: every held-out problem (20 <= tracking.eval_samples) at each
    # evaluation, agreeing with eval/accuracy.
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "eval/samples.json", str(tmp_path))).read_text())
    assert table["columns"] == ["problem", "step", "prompt", "answer", "output", "correct"]
    by_step: dict[int, list] = {}
    for row in table["data"]:
        by_step.setdefault(row[1], []).append(row[1:])
        assert row[0] == f"step {row[1]}: {row[2]} (answer {row[3]})"  # the reference in the compared column
    assert list(by_step) == [6, 3, 0] and all(len(rows) == 20 for rows in by_step.values())  # newest first
    for m in accuracy:
        rows = by_step[m.step]
        assert sum(r[4] for r in rows) / 20 == pytest.approx(m.value)
        assert all(r[3] == r[2] for r in rows if r[4])  # a correct output is the answer
    assert '"eval/samples.json"' in run.data.tags["mlflow.loggedArtifacts"]
    page = Path(client.download_artifacts(run.info.run_id, "eval/samples.html", str(tmp_path))).read_text()
    assert page.count("<tr>") == 61 and page.index(f"<td>6</td><td>{table['data'][0][2]}</td>") < page.index(
        "<td>3</td>"
    )
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(run.data.metrics)
    # Sampled every second in a run's first minute (MLflow's 10 s gave a short run one sample).
    seconds = (run.info.end_time - run.info.start_time) / 1000
    samples = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(samples) >= min(int(seconds) - 1, 3), (seconds, len(samples))
    artifacts = {a.path for folder in ("", "plots", "history") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {
        "spec.yaml",
        "plots/curves.png",
        "plots/staleness.png",
        "plots/timeline.png",
        "history/history.csv",
    } <= artifacts


def test_a_failing_run_is_marked_failed_with_its_error(store):
    spec = load_spec(QUICKSTART, [s for s in SHORT if s != "--set"])

    def explode(step: int, metrics: dict[str, float]) -> None:
        if step == 2:
            raise RuntimeError("boom at step 2")

    with pytest.raises(RuntimeError, match="boom"):
        run_experiment(spec, on_metrics=explode)
    (run,) = runs(store)
    assert run.info.status == "FAILED"
    assert "boom at step 2" in run.data.tags["error"]


def test_schema_command_prints_json_schema():
    done = subprocess.run([*cli(), "schema"], capture_output=True, text=True, env=env())
    assert done.returncode == 0 and '"ExperimentSpec"' in done.stdout


def test_warmstart_builds_a_measured_checkpoint_and_never_overwrites(store, tmp_path):
    out = tmp_path / "start"
    args = [
        *cli(),
        "warmstart",
        "--out",
        str(out),
        "--set",
        "model.warm_start.steps=3",
        "--set",
        "model.warm_start.batch_size=8",
        "--set",
        "task.eval_size=20",
    ]
    done = subprocess.run(args, capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "asyncrlhf.json").read_text())
    assert manifest["warm_start"]["steps"] == 3 and manifest["eval"]["eval_size"] == 20
    accuracy = manifest["eval"]["greedy_accuracy"]
    assert 0.0 <= accuracy <= 1.0 and f"held-out greedy accuracy {accuracy:.3f}" in done.stdout
    model, _ = load_pretrained(out)  # a Hugging Face directory that runs can point at
    assert sum(p.numel() for p in model.parameters()) > 0
    again = subprocess.run(args, capture_output=True, text=True, env=env())
    assert again.returncode == 2 and "already exists" in again.stderr
    assert json.loads((out / "asyncrlhf.json").read_text()) == manifest
    assert runs(store) == []  # building a start checkpoint is not a run


@pytest.mark.nightly  # CI: the same property in process (tests/orchestration/test_orchestrator.py)
def test_sync_and_lagged_k0_are_the_same_run_step_for_step_through_the_cli(store):
    """Lagged with k = 0 generates every batch with the weights sync uses: through the
    CLI and MLflow, the two runs' learning curves are identical, step for step."""
    curves = {}
    for mode in ("--set=orchestrator.mode=sync", "--set=orchestrator.lag=0"):
        done = subprocess.run(
            [*cli(), "run", str(QUICKSTART), *SHORT, mode, "--set", "runtime.torch_threads=1"],
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        (run,) = [r for r in runs(store) if r.info.run_id not in {c[0] for c in curves.values()}]
        client = MlflowClient(store)
        keys = ("reward/mean", "loss/policy", "eval/accuracy", "staleness/max", "policy/clip_frac")
        history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in keys}
        curves[mode] = (run.info.run_id, history)
    (_, sync), (_, lagged) = curves.values()
    assert sync == lagged and len(sync["reward/mean"]) == 6 and len(sync["eval/accuracy"]) == 3
