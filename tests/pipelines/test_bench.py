from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.bench.gate import Figure, compare
from pipelines.bench.suite import SUITES
from tests.pipelines.conftest import cli, env


def fig(name: str, value: float, better: str = "higher", **kwargs) -> Figure:  # type: ignore[no-untyped-def]
    return Figure(name, value, value, value, better, **kwargs)  # type: ignore[arg-type]


def test_gate_uses_relative_and_absolute_tolerances():
    baseline = {"speed": {"median": 10.0}, "cost": {"median": 2.0}, "bubble": {"median": 0.05}}
    result = {
        c.figure.name: c
        for c in compare(
            [
                fig("speed", 7.4),
                fig("cost", 2.4, "lower"),
                fig("bubble", 0.11, "lower", tolerance=0.05, absolute=True),
                fig("fresh", 1.0),
            ],
            baseline,
            tolerance=0.25,
        )
    }
    assert result["speed"].status == "regressed" and result["speed"].limit == pytest.approx(7.5)  # 10 × (1 − 0.25)
    assert result["cost"].status == "ok" and result["cost"].limit == pytest.approx(2.5)  # 2 × (1 + 0.25)
    assert result["bubble"].status == "regressed" and result["bubble"].limit == pytest.approx(0.10)  # 0.05 + 0.05
    assert result["fresh"].status == "new"


def test_informational_figures_are_never_gated():
    # e.g. the buffer throughput ratios, bimodal under GIL scheduling
    (c,) = compare([fig("in-process", 0.1, gate=False)], {"in-process": {"median": 5.0}}, tolerance=0.1)
    assert c.status == "info"


def bench(tmp_path, *args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    report = tmp_path / "report.json"
    command = [*cli(), "bench", "--suite", "quick", "--report", str(report), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env(), timeout=600)


def baseline_file(tmp_path, figures: dict[str, float]) -> str:
    path = tmp_path / "baseline.json"
    path.write_text(
        json.dumps(
            {
                "suites": {
                    "quick": {
                        "environment": {},
                        "figures": {name: {"median": value} for name, value in figures.items()},
                    }
                }
            }
        )
    )
    return str(path)


def test_gate_fails_on_a_baseline_the_figures_are_worse_than(tmp_path, store):
    # M2PO cannot cost 1% of PPO (lower is better); GRPO easily costs under 1000× PPO.
    unreachable = baseline_file(tmp_path, {"losses.m2po_vs_ppo": 0.01, "losses.grpo_vs_ppo": 1000.0})
    done = bench(tmp_path, "--case", "losses", "--baseline", unreachable, "--uri", store)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "REGRESSION losses.m2po_vs_ppo" in done.stdout
    assert "REGRESSION losses.grpo_vs_ppo" not in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["regressions"] == ["losses.m2po_vs_ppo"]
    # In MLflow: a regressed run is FAILED; figures grouped by case, each beside its
    # baseline, limit and verdict; the report and a trend plot attached; the load recorded.
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("benchmarks").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["status"] == "regressed"
    assert "losses.m2po_vs_ppo" in run.data.tags["error"] and "load_avg_1m" in run.data.params
    assert set(run.data.metrics) >= {"bench/losses/m2po_vs_ppo", "bench/losses/grpo_vs_ppo"}
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "figures.json", str(tmp_path))).read_text())
    rows = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["data"]}
    assert rows["losses.m2po_vs_ppo"]["verdict"] == "regressed" and rows["losses.m2po_vs_ppo"]["baseline"] == 0.01
    assert rows["losses.grpo_vs_ppo"]["verdict"] == "ok" and rows["losses.grpo_vs_ppo"]["limit"] == 1250.0
    assert {"report.json", "trend.png"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


def test_gate_passes_against_a_baseline_the_figures_meet(tmp_path):
    lenient = baseline_file(tmp_path, {"losses.m2po_vs_ppo": 1000.0, "losses.grpo_vs_ppo": 1000.0})
    done = bench(tmp_path, "--case", "losses", "--baseline", lenient, "--no-track")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "REGRESSION" not in done.stdout


def test_update_baseline_rewrites_it_with_the_environment(tmp_path):
    path = tmp_path / "new-baseline.json"
    done = bench(tmp_path, "--case", "losses", "--baseline", str(path), "--update-baseline", "--no-track")
    assert done.returncode == 0, done.stdout[-3000:]
    data = json.loads(path.read_text())["suites"]["quick"]
    assert set(data["figures"]) == {
        "losses.m2po_vs_ppo",
        "losses.m2po_trust_region_vs_ppo",
        "losses.m2po_token_vs_ppo",
        "losses.grpo_vs_ppo",
    }
    assert data["environment"]["torch"] and data["environment"]["cpu_count"]


def test_bad_arguments_fail_clearly(tmp_path):
    done = bench(tmp_path, "--case", "nope", "--no-track")
    assert done.returncode == 2 and "no case ['nope']" in done.stderr
    done = subprocess.run([*cli(), "bench", "--suite", "huge"], capture_output=True, text=True, env=env())
    assert done.returncode == 2 and "unknown suite 'huge'" in done.stderr


@pytest.mark.slow
def test_quick_suite_end_to_end_into_mlflow(tmp_path, store):
    # every case of the quick suite but the checkpoint one (a 200-step run: the nightly
    # benchmark workflow runs it)
    cases = [arg for case in SUITES["quick"] if case != "checkpoint" for arg in ("--case", case)]
    done = bench(tmp_path, "--baseline", str(tmp_path / "none.json"), "--uri", store, *cases)
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    names = {f["name"] for f in report["figures"]}
    assert {
        "reward.speedup_vs_loop.B256_L1024",
        "losses.m2po_vs_ppo",
        "buffer.bounded_vs_deque",
        "overhead.tracking_frac",
        "decoded.symbolic.pool2_vs_loop",
        "decoded.tensor_vs_decoded",
    } <= names
    assert all(f["min"] <= f["median"] <= f["max"] for f in report["figures"])
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("benchmarks")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["suite"] == "quick" and "torch" in run.data.params and run.info.status == "FINISHED"
    assert "bench/reward/speedup_vs_loop.B256_L1024" in run.data.metrics


def test_a_baseline_update_of_some_cases_keeps_the_environment_of_the_others(tmp_path):
    from pipelines.bench.gate import write_baseline

    path = tmp_path / "baseline.json"
    write_baseline(path, "full", [fig("reward.speedup", 5.0), fig("step.speedup", 2.0)], {"machine": "xeon"})
    write_baseline(path, "full", [fig("step.speedup", 3.0)], {"machine": "epyc"})
    entry = json.loads(path.read_text())["suites"]["full"]
    assert entry["environment"] == {"machine": "xeon"}  # reward's figure was measured there
    assert entry["step_environment"] == {"machine": "epyc"}
    assert entry["figures"]["step.speedup"]["median"] == 3.0 and entry["figures"]["reward.speedup"]["median"] == 5.0
    write_baseline(path, "full", [fig("reward.speedup", 6.0), fig("step.speedup", 4.0)], {"machine": "amd"})
    entry = json.loads(path.read_text())["suites"]["full"]
    assert entry["environment"] == {"machine": "amd"} and "step_environment" not in entry  # every case rerun
