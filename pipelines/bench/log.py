"""A benchmark run in MLflow: figures grouped by case, each beside its baseline, limit and
verdict, the report attached, the machine's load recorded, a regression marked FAILED,
and each gated figure's trend over the suite's earlier runs (one per commit)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pipelines.tracking import new_run
from pipelines.tracking.store import end_run, open_store

__all__ = ["load_average", "log_benchmark", "metric_name"]

EXPERIMENT = "benchmarks"


def load_average() -> dict[str, float]:
    """The machine's load before a benchmark: a 5× swing between two runs at one commit
    is then visibly the machine, not the code."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return {}
    return {"load_avg_1m": round(one, 2), "load_avg_5m": round(five, 2)}


def metric_name(figure: str) -> str:
    """``reward.speedup_vs_loop.B256_L1024`` → ``bench/reward/speedup_vs_loop.B256_L1024``:
    the case as the chart section."""
    case, _, rest = figure.partition(".")
    return f"bench/{case}/{rest or case}"


def log_benchmark(
    uri: str | None,
    suite: str,
    comparisons: list[Any],
    env: dict[str, Any],
    report: Path | None = None,
    started: float | None = None,
) -> str:
    """One run in the ``benchmarks`` experiment; its id.

    Params: the environment (machine, versions, load before the run). Metrics: each
    figure's median, ``bench/<case>/<figure>``. ``figures.json`` (an MLflow table): median,
    min, max, baseline, limit, verdict and target per figure. Artifacts: the JSON report
    and ``trend.png``. Status: FAILED when a figure regressed (tag ``status``). Named by
    suite, time and commit (``quick·12-02 05:40·d2fceb1``); it lasts from ``started`` (the
    suite's start, epoch seconds) to now.
    """
    from mlflow.entities import Metric

    client = open_store(uri)
    regressed = [c.figure.name for c in comparisons if c.status == "regressed"]
    tags = {"suite": suite, "status": "regressed" if regressed else "ok", "regressed": ", ".join(regressed)[:4000]}
    if env.get("git_commit"):
        tags["mlflow.source.git.commit"] = env["git_commit"]
    start = started or time.time()
    name = f"{suite}·{time.strftime('%m-%d %H:%M', time.localtime(start))}·{(env.get('git_commit') or 'nogit')[:7]}"
    run_id = new_run(client, EXPERIMENT, name, tags, {**env, "suite": suite}, int(start * 1000))
    now = int(time.time() * 1000)
    metrics = [Metric(metric_name(c.figure.name), c.figure.median, now, 0) for c in comparisons]
    client.log_batch(run_id, metrics=metrics, synchronous=True)
    client.log_table(run_id, data=_table(comparisons), artifact_file="figures.json")
    with tempfile.TemporaryDirectory(prefix="asyncrlhf-bench-") as tmp:
        if report is not None and report.exists():
            client.log_artifact(run_id, str(report))
        trend = _plot_trend(client, suite, comparisons, Path(tmp) / "trend.png")
        if trend is not None:
            client.log_artifact(run_id, str(trend))
    if regressed:
        end_run(client, run_id, "FAILED", "regressed", {"error": f"regressed: {', '.join(regressed)}"[:4000]})
    else:
        end_run(client, run_id, "FINISHED", "finished")
    return run_id


def _table(comparisons: list[Any]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {
        k: [] for k in ("figure", "median", "min", "max", "unit", "baseline", "limit", "verdict", "better", "target")
    }
    for c in comparisons:
        f = c.figure
        row = [f.name, f.median, f.min, f.max, f.unit, c.baseline, c.limit, c.status, f.better, f.target]
        for key, value in zip(columns, row, strict=True):
            columns[key].append(value)
    return columns


def _plot_trend(client: Any, suite: str, comparisons: list[Any], path: Path) -> Path | None:
    """Each gated figure of this run over the suite's runs, oldest first, labelled by commit."""
    from pipelines.bench.trend import Gated, plot_trend

    gated = {
        metric_name(c.figure.name): Gated(c.baseline, c.limit, c.figure.better)
        for c in comparisons
        if c.status in ("ok", "regressed") and c.baseline is not None and c.limit is not None
    }
    if not gated:
        return None
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.suite = '{suite}'", order_by=["start_time ASC"], max_results=200
    )
    labels = [(r.data.tags.get("mlflow.source.git.commit") or "?")[:7] for r in runs]
    series = {name: [r.data.metrics.get(name) for r in runs] for name in gated}
    plot_trend(series, labels, gated, f"benchmark suite {json.dumps(suite)}", path)
    return path
