"""A staleness sweep's curves: seed means per step from the runs in a real MLflow store."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from pipelines.sweeps import load_sweep
from pipelines.sweeps.curves import study_curves, write_study_curves
from pipelines.sweeps.report import SweepReport
from tests.pipelines.conftest import REPO


def test_curves_average_the_seeds_at_shared_steps_and_count_accuracy_in_updates(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("study", artifact_location=str(tmp_path / "artifacts"))

    def run(accuracy: dict[int, float], m2: dict[int, float]) -> str:
        run_id = client.create_run(experiment).info.run_id
        client.log_param(run_id, "trainer.mini_batches", "4")  # 4 updates per step
        for step, value in accuracy.items():
            client.log_metric(run_id, "eval/accuracy", value, step=step)
        for step, value in m2.items():
            client.log_metric(run_id, "policy/m2", value, step=step)
        return run_id

    sweep, _ = load_sweep(REPO / "experiments" / "staleness_study.yaml")
    rows = [
        {
            "state": "COMPLETE",
            "params": {"orchestrator.lag": 4, "algorithm": "grpo"},
            "run_ids": {
                "0": run({0: 0.4, 50: 0.5, 100: 0.6}, {1: 0.1, 2: 0.3}),
                "1": run({0: 0.4, 50: 0.3}, {1: 0.2, 2: 0.5}),
            },
        },
        {
            "state": "COMPLETE",
            "params": {"orchestrator.lag": 0, "algorithm": "m2po_batch"},
            "run_ids": {"0": run({0: 0.4, 50: 0.45}, {1: 0.01})},
        },
        {
            "state": "FAIL",
            "params": {"orchestrator.lag": 0, "algorithm": "grpo"},
            "run_ids": {"0": run({0: 0.9}, {1: 9.0})},
        },  # a failed configuration draws nothing
    ]
    report = SweepReport(sweep, rows)
    curves = study_curves(client, report)

    # Accuracy by optimiser update (step × 4), at the steps both seeds reached: mean, min, max.
    xs, mean, low, high = curves["eval/accuracy"][4]["grpo"]
    assert (xs, low, high) == ([0, 200], [0.4, 0.3], [0.4, 0.5]) and mean == pytest.approx([0.4, 0.4])
    xs, mean, low, high = curves["policy/m2"][4]["grpo"]  # per step
    assert xs == [1, 2] and mean == pytest.approx([0.15, 0.4]) and (low, high) == ([0.1, 0.3], [0.2, 0.5])
    assert list(curves["eval/accuracy"]) == [0, 4]  # staleness ascending
    assert set(curves["eval/accuracy"][0]) == {"m2po_batch"}
    assert "policy/clip_frac" not in curves  # never logged: no empty row of panels

    path = write_study_curves(client, report, tmp_path)
    assert path == tmp_path / "curves_by_staleness.png" and path.stat().st_size > 10_000


def test_in_flight_arms_draw_lines_of_their_own(tmp_path):
    """The in-flight study's curves once merged each algorithm's two arms into one line
    (the later trial overwrote the earlier): each arm is its own line now."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("study", artifact_location=str(tmp_path / "artifacts"))

    def run(accuracy: float) -> str:
        run_id = client.create_run(experiment).info.run_id
        client.log_metric(run_id, "eval/accuracy", accuracy, step=0)
        return run_id

    sweep, _ = load_sweep(REPO / "experiments" / "staleness_study_inflight.yaml")
    rows = [
        {
            "state": "COMPLETE",
            "params": {"orchestrator.lag": 4, "orchestrator.inflight": arm, "algorithm": "grpo"},
            "run_ids": {"0": run(accuracy)},
        }
        for arm, accuracy in (("none", 0.3), ("switch_1_4", 0.2))
    ]
    curves = study_curves(client, SweepReport(sweep, rows))["eval/accuracy"][4]
    assert {label: curve[1] for label, curve in curves.items()} == {"grpo · none": [0.3], "grpo · switch_1_4": [0.2]}
