"""The full quick start, as the README runs it, learns (slow: about 2 minutes)."""

from __future__ import annotations

import pytest

from pipelines.run import run_experiment
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO


@pytest.mark.slow
def test_quickstart_lifts_held_out_accuracy_by_20_points(store):
    result = run_experiment(load_spec(REPO / "experiments" / "quickstart.yaml"))
    start = result.history.initial_metrics["eval/accuracy"]
    final = result.final_metrics["eval/accuracy"]
    tracking = result.final_metrics["perf/tracking_frac"]
    print(f"quickstart: held-out accuracy {start:.3f} -> {final:.3f}, tracking {tracking:.2%} of the run")
    assert final - start >= 0.20
    assert tracking < 0.05
    assert all(tau <= 1 for step in result.history.staleness for tau in step)
