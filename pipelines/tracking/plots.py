"""PNG plots: a run's learning curves, staleness and rollout/trainer timeline; a sweep's objective.

A run's plots are titled with what identifies it (run name, algorithm, mode, the staleness
setting and lr), so a PNG seen alone still says which run it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrlhf.orchestration import RunHistory

__all__ = [
    "plot_curves",
    "plot_objective",
    "plot_run_staleness",
    "plot_staleness",
    "plot_study_curves",
    "plot_timeline",
    "plot_trend",
]

_GANTT_MAX_EVENTS = 300  # beyond this a Gantt chart is a barcode: the timeline shows shares per time bin

_PHASE_COLOURS = {
    "generate": "#4c78a8",
    "reward": "#72b7b2",
    "load_weights": "#b279a2",
    "train": "#f58518",
    "publish": "#e45756",
    "eval": "#54a24b",
    "wait": "#dddddd",
    "restart": "#000000",
}


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: RunHistory, path: Path, title: str = "") -> None:
    """Reward per step and held-out accuracy per evaluation, one figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    reward = history.metric("reward/mean")
    ax.plot([s for s, _ in reward], [v for _, v in reward], color="#4c78a8", alpha=0.6, label="reward/mean")
    accuracy = history.metric("eval/accuracy")
    if "eval/accuracy" in history.initial_metrics:
        accuracy = [(0, history.initial_metrics["eval/accuracy"]), *accuracy]
    if accuracy:
        ax.plot([s for s, _ in accuracy], [v for _, v in accuracy], "o-", color="#f58518", label="eval/accuracy")
    ax.set_xlabel("trainer step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(f"{title or history.mode}\nreward and held-out accuracy", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_run_staleness(history: RunHistory, path: Path, title: str = "") -> None:
    """Staleness of every trained batch, per step: mean and max in policy versions (and the
    mean in optimiser updates when a step makes more than one)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key, style in (("staleness/mean", "-"), ("staleness/max", ":"), ("staleness/updates", "--")):
        points = history.metric(key)
        if key == "staleness/updates" and all(
            v == m for (_, v), (_, m) in zip(points, history.metric("staleness/mean"), strict=False)
        ):
            continue  # one update per step: the same line as the mean
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], style, label=key)
    ax.set_xlabel("trainer step")
    ax.set_ylabel("staleness")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"{title or history.mode}\nstaleness of the trained batches", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(history: RunHistory, path: Path, title: str = "") -> None:
    """What each worker did when: a Gantt chart (one row per worker, one colour per phase)
    for short runs; beyond a few hundred events, each worker's share of time per phase in
    60 time bins, which stays readable at any run length. The legend lists only the phases
    that occur."""
    plt = _pyplot()
    events = history.timeline
    workers = sorted({e.worker for e in events})
    phases = [p for p in _PHASE_COLOURS if any(e.phase == p for e in events)]
    gantt = len(events) <= _GANTT_MAX_EVENTS
    rows = 1 if gantt or not workers else len(workers)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.6 if gantt else 1.6 * rows + 1), squeeze=False, sharex=True)
    if events:
        origin = min(e.start for e in events)
        if gantt:
            _gantt(axes[0, 0], events, workers, phases, origin)
        else:
            for ax, worker in zip(axes[:, 0], workers, strict=True):
                _shares(ax, [e for e in events if e.worker == worker], phases, origin, max(e.end for e in events))
                ax.set_ylabel(worker, fontsize=8)
        handles = [plt.Rectangle((0, 0), 1, 1, color=_PHASE_COLOURS[p]) for p in phases]
        fig.legend(handles, phases, ncol=max(1, len(phases)), fontsize=7, loc="lower center")
    axes[-1, 0].set_xlabel("seconds since start")
    axes[0, 0].set_title(
        f"{title or history.mode}\ntimeline" + ("" if gantt else ": share of time per phase"), fontsize=9
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gantt(ax: Any, events: list[Any], workers: list[str], phases: list[str], origin: float) -> None:
    for row, worker in enumerate(workers):
        for phase in phases:
            spans = [(e.start - origin, e.end - e.start) for e in events if (e.worker, e.phase) == (worker, phase)]
            if spans:
                ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=_PHASE_COLOURS[phase])
    ax.set_yticks(range(len(workers)), workers)


def _shares(ax: Any, events: list[Any], phases: list[str], origin: float, end: float, bins: int = 60) -> None:
    """Stacked share of each phase in each of ``bins`` equal time bins."""
    import numpy as np

    edges = np.linspace(0.0, max(end - origin, 1e-9), bins + 1)
    shares = {p: np.zeros(bins) for p in phases}
    for e in events:
        start, stop = e.start - origin, e.end - origin
        overlap = np.clip(np.minimum(edges[1:], stop) - np.maximum(edges[:-1], start), 0.0, None)
        shares[e.phase] += overlap / (edges[1] - edges[0])
    ax.stackplot(
        (edges[:-1] + edges[1:]) / 2,
        [np.clip(shares[p], 0, 1) for p in phases],
        colors=[_PHASE_COLOURS[p] for p in phases],
    )
    ax.set_ylim(0, 1)


def plot_objective(
    rows: list[dict[str, Any]], keys: list[str], objective: str, log_keys: set[str], title: str, path: Path
) -> None:
    """A sweep's objective against each swept field (one panel per field, one point per
    configuration; with seeds, the seed mean with its 95% CI as an error bar)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        values = [r["params"][key] for r in rows]
        scores = [r["value"] for r in rows]
        errors = [r.get("ci95") or 0.0 for r in rows]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            xs = values
            if key in log_keys:
                ax.set_xscale("log")
        else:
            labels = sorted({str(v) for v in values})
            xs = [labels.index(str(v)) for v in values]
            ax.set_xticks(range(len(labels)), labels)
        ax.errorbar(xs, scores, yerr=errors, fmt="o", color="#4c78a8", ecolor="#9ecae9", capsize=3)
        if all(0.0 <= v <= 1.0 for v in scores):  # a share (accuracy): its whole range, so a gap inside the
            ax.set_ylim(0.0, 1.0)  # noise is not magnified into a difference
        ax.set_xlabel(key)
        ax.set_ylabel(objective)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_staleness(table: dict[str, dict[Any, Any]], key: str, objective: str, title: str, path: Path) -> None:
    """Final objective against staleness, one line per algorithm (``table[algo][k]`` a
    :class:`~pipelines.sweeps.stats.SeedSummary`): the mean, with a 95% CI band where n > 1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    share = all(0.0 <= s.mean <= 1.0 for by_k in table.values() for s in by_k.values())
    for i, algo in enumerate(sorted(table)):  # colours by sorted label, as plot_study_curves
        by_k = table[algo]
        ks = list(by_k)
        means = [s.mean for s in by_k.values()]
        half = [s.ci95 if s.n > 1 else 0.0 for s in by_k.values()]
        ax.plot(ks, means, "o-", label=algo, color=f"C{i}")
        if any(half):  # a share's interval drawn within [0, 1]
            lows = [max(m - h, 0.0) if share else m - h for m, h in zip(means, half, strict=True)]
            highs = [min(m + h, 1.0) if share else m + h for m, h in zip(means, half, strict=True)]
            ax.fill_between(ks, lows, highs, color=f"C{i}", alpha=0.15)
            ax.errorbar(
                ks,
                means,
                yerr=[
                    [m - lo for m, lo in zip(means, lows, strict=True)],
                    [hi - m for m, hi in zip(means, highs, strict=True)],
                ],
                fmt="none",
                ecolor=f"C{i}",
                capsize=3,
            )
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel(f"staleness ({key})")
    ax.set_ylabel(f"final {objective}")
    ax.grid(alpha=0.3)
    if table:
        ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_trend(series: dict[str, list[float | None]], labels: list[str], xlabel: str, path: Path) -> None:
    """One panel per figure: its value in each run (None: not measured), runs labelled."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 1.8 * len(series) + 0.6), squeeze=False, sharex=True)
    for ax, (name, values) in zip(axes[:, 0], series.items(), strict=True):
        xs = [i for i, v in enumerate(values) if v is not None]
        ax.plot(xs, [values[i] for i in xs], marker="o")
        ax.set_title(name, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_study_curves(
    curves: dict[str, dict[Any, dict[Any, Any]]], objective: str, key: str, title: str, path: Path
) -> None:
    """A staleness sweep's curves: one row per metric (the objective against optimiser
    updates first, then per-step statistics), one column per staleness value, one line
    per objective: the seed mean with the seeds' range as a band."""
    plt = _pyplot()
    metrics = list(curves)
    lags = sorted({k for by_k in curves.values() for k in by_k})
    labels = sorted({label for by_k in curves.values() for by_label in by_k.values() for label in by_label})
    colours = {label: f"C{i}" for i, label in enumerate(labels)}
    fig, axes = plt.subplots(
        len(metrics), len(lags), figsize=(3.4 * len(lags), 2.4 * len(metrics)), squeeze=False, sharey="row"
    )
    for row, metric in enumerate(metrics):
        for col, lag in enumerate(lags):
            ax = axes[row, col]
            for label, (xs, mean, low, high) in curves[metric].get(lag, {}).items():
                ax.plot(xs, mean, color=colours[label], label=label, lw=1.2)
                ax.fill_between(xs, low, high, color=colours[label], alpha=0.15, lw=0)
            if metric in ("policy/m2", "policy/ratio_max"):  # spans decades once data is stale
                ax.set_yscale("symlog", linthresh=1e-3)
            if row == 0:
                ax.set_title(f"{key} = {lag}", fontsize=8)
            ax.set_xlabel("optimiser update" if metric == objective else "step", fontsize=8)
            ax.set_ylabel(metric if col == 0 else "", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title + " (seed mean; band: seed range)", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
