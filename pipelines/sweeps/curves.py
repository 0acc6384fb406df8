"""A staleness sweep's curves over training, read back from its runs in MLflow.

The summary table holds each configuration's final objective; these are the paths that
led there: the objective against optimiser updates, and the trust-region statistics
(``policy/m2``, the clip and mask fractions, ``policy/ratio_max``) against the step, one
panel per staleness value and one line per objective, and per in-flight arm when the
sweep has them (the seed mean, with the seeds' range as a band).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pipelines.sweeps.report import SweepReport, arm_label, staleness_axes
from pipelines.tracking.plots import plot_study_curves

__all__ = ["CURVE_METRICS", "Curve", "study_curves", "write_study_curves"]

# What is drawn per step besides the objective (which is drawn per update).
CURVE_METRICS = ("policy/m2", "policy/clip_frac", "policy/masked_frac", "policy/ratio_max")

Curve = tuple[list[float], list[float], list[float], list[float]]  # x, seed mean, seed min, seed max


def _updates_per_step(params: dict[str, str]) -> int:
    """Optimiser updates per trainer step, from a run's logged spec."""
    return int(params.get("trainer.mini_batches", 1)) * int(params.get("trainer.ppo_epochs", 1))


def _seed_curve(series: list[dict[int, float]], scale: int = 1) -> Curve | None:
    """Mean, min and max over seeds at every step all seeds logged."""
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not steps:
        return None
    values = [[s[step] for s in series] for step in steps]
    return (
        [step * scale for step in steps],
        [statistics.fmean(v) for v in values],
        [min(v) for v in values],
        [max(v) for v in values],
    )


def study_curves(client: Any, report: SweepReport) -> dict[str, dict[Any, dict[Any, Curve]]]:
    """``curves[metric][staleness][objective label]`` over the complete configurations'
    runs; the sweep's objective is keyed by optimiser update, the rest by step."""
    axes = staleness_axes(report.sweep)
    assert axes is not None, "not a staleness sweep"
    key = axes[0]
    objective = report.sweep.objective
    curves: dict[str, dict[Any, dict[Any, Curve]]] = {m: {} for m in (objective, *CURVE_METRICS)}
    for row in report.rows:
        if row["state"] != "COMPLETE" or not row["run_ids"]:
            continue
        label = arm_label(report.sweep, row["params"])  # with the in-flight arm, when swept
        run_ids = list(row["run_ids"].values())
        scale = _updates_per_step(client.get_run(run_ids[0]).data.params)
        for metric in curves:
            series = [{m.step: m.value for m in client.get_metric_history(run_id, metric)} for run_id in run_ids]
            curve = _seed_curve([s for s in series if s], scale if metric == objective else 1)
            if curve is not None:
                curves[metric].setdefault(row["params"][key], {})[label] = curve
    return {metric: dict(sorted(by_k.items())) for metric, by_k in curves.items() if by_k}


def write_study_curves(client: Any, report: SweepReport, folder: Path) -> Path | None:
    """``curves_by_staleness.png`` in ``folder`` for a staleness sweep with complete runs."""
    axes = staleness_axes(report.sweep)
    if axes is None:
        return None
    curves = study_curves(client, report)
    if report.sweep.objective not in curves:
        return None
    path = folder / "curves_by_staleness.png"
    plot_study_curves(curves, report.sweep.objective, axes[0], f"{report.sweep.name}: curves by staleness", path)
    return path
