"""PNG plots: a run's learning curves, staleness and rollout/trainer timeline; a sweep's objective.

A run's plots are titled with what identifies it (run name, algorithm, mode, the staleness
setting and lr), so a PNG seen alone still says which run it is."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from asyncrlhf.orchestration import RunHistory

__all__ = [
    "overflow",
    "plot_curves",
    "plot_objective",
    "plot_run_staleness",
    "plot_staleness",
    "plot_study_curves",
    "plot_timeline",
    "pyplot",
    "save",
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


def pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    # Readable at 100% zoom: no text under 10 pt.
    sizes = ("font.size", "axes.labelsize", "xtick.labelsize", "ytick.labelsize", "legend.fontsize")
    plt.rcParams.update({**dict.fromkeys(sizes, 10), "axes.titlesize": 11, "figure.titlesize": 12})
    return plt


def overflow(fig: Any) -> list[str]:
    """The figure's drawn texts (titles, axis labels, tick labels in view, legends,
    annotations) that reach outside it."""
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    texts = [*fig.texts, *(t for legend in fig.legends for t in legend.get_texts())]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        if ax.get_legend() is not None:
            texts += ax.get_legend().get_texts()
        for axis, (low, high) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            texts += [t.label1 for t in axis.get_major_ticks() if low <= t.get_loc() <= high and t.label1.get_visible()]
    outside = []
    for text in texts:
        if not text.get_visible() or not str(text.get_text()).strip():
            continue
        extent = text.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.x1 > box.x1 + 1 or extent.y0 < box.y0 - 1 or extent.y1 > box.y1 + 1:
            outside.append(str(text.get_text()))
    return outside


def _fit_titles(fig: Any) -> None:
    """Wrap each title (and the suptitle) onto more lines until it fits its width."""
    import textwrap

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    titles = [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    if fig._suptitle is not None:
        titles.append(fig._suptitle)
    for title in titles:
        text = title.get_text()
        if not text:
            continue
        room = 0.96 * (fig.bbox.width if title is fig._suptitle else title.axes.bbox.width + 40)
        width = max(len(line) for line in text.splitlines())
        while title.get_window_extent(renderer).width > room and width > 12:
            width = int(width * 0.85)
            title.set_text("\n".join(textwrap.fill(line, width) for line in text.splitlines()))


def save(fig: Any, path: Path, dpi: int = 110, rect: tuple[float, float, float, float] | None = None) -> None:
    """Titles fitted, laid out, written, closed."""
    plt = pyplot()
    _fit_titles(fig)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _legend_beside(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)


def plot_curves(history: RunHistory, path: Path, title: str = "") -> None:
    """Reward per step and held-out accuracy per evaluation, one figure; the axis spans
    the data (a 5-point change is visible) and the accuracy at the start is marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4))
    reward = history.metric("reward/mean")
    ax.plot([s for s, _ in reward], [v for _, v in reward], color="#4c78a8", alpha=0.6, label="reward/mean")
    accuracy = history.metric("eval/accuracy")
    if "eval/accuracy" in history.initial_metrics:
        start = history.initial_metrics["eval/accuracy"]
        accuracy = [(0, start), *accuracy]
        ax.axhline(start, color="#f58518", ls=":", lw=1, label=f"accuracy at start ({start:.3f})")
    if accuracy:
        ax.plot([s for s, _ in accuracy], [v for _, v in accuracy], "o-", color="#f58518", label="eval/accuracy")
    _finish_run_plot(fig, ax, path, f"{title or history.mode}: reward and held-out accuracy")


def plot_run_staleness(history: RunHistory, path: Path, title: str = "") -> None:
    """Staleness of every trained batch, per step: mean and max in policy versions (and the
    mean in optimiser updates when a step makes more than one)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    for key, style in (("staleness/mean", "-"), ("staleness/max", ":"), ("staleness/updates", "--")):
        points = history.metric(key)
        if key == "staleness/updates" and all(
            v == m for (_, v), (_, m) in zip(points, history.metric("staleness/mean"), strict=False)
        ):
            continue  # one update per step: the same line as the mean
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], style, label=key)
    ax.set_ylabel("staleness")
    _finish_run_plot(fig, ax, path, f"{title or history.mode}: staleness of the trained batches")


def _finish_run_plot(fig: Any, ax: Any, path: Path, title: str) -> None:
    """A per-step plot's common end: step axis, grid, legend beside, title, saved."""
    ax.set_xlabel("trainer step")
    ax.grid(alpha=0.3)
    if ax.lines:
        _legend_beside(ax)
    ax.set_title(title, loc="left")
    save(fig, path)


def plot_timeline(history: RunHistory, path: Path, title: str = "") -> None:
    """What each worker did when: a Gantt chart (one row per worker, one colour per phase)
    for short runs; beyond a few hundred events, each worker's share of time per phase in
    60 time bins, which stays readable at any run length. The legend lists only the phases
    that occur."""
    plt = pyplot()
    events = history.timeline
    workers = sorted({e.worker for e in events})
    phases = [p for p in _PHASE_COLOURS if any(e.phase == p for e in events)]
    gantt = len(events) <= _GANTT_MAX_EVENTS
    rows = 1 if gantt or not workers else len(workers)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 3 if gantt else 1.7 * rows + 1), squeeze=False, sharex=True)
    if events:
        origin = min(e.start for e in events)
        if gantt:
            _gantt(axes[0, 0], events, workers, phases, origin)
        else:
            for ax, worker in zip(axes[:, 0], workers, strict=True):
                _shares(ax, [e for e in events if e.worker == worker], phases, origin, max(e.end for e in events))
                ax.set_ylabel(worker)
        handles = [plt.Rectangle((0, 0), 1, 1, color=_PHASE_COLOURS[p]) for p in phases]
        fig.legend(handles, phases, loc="center right", frameon=False)
    axes[-1, 0].set_xlabel("seconds since start")
    axes[0, 0].set_title(
        f"{title or history.mode}: timeline" + ("" if gantt else ", share of time per phase"), loc="left"
    )
    save(fig, path, rect=(0, 0, 0.86, 1))


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
    rows: list[dict[str, Any]], keys: list[str], objective: str, ranges: dict[str, bool], title: str, path: Path
) -> None:
    """A sweep's objective against each swept field (one panel per field, one point per
    configuration; with seeds, the seed mean with its 95% CI as an error bar). A grid's
    values are evenly spaced and each labelled, and configurations sharing a value stand
    side by side, not on top of each other; a sampled range (``ranges``: key → log scale)
    keeps its numeric axis."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(max(4.5 * len(keys), 6.5), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        values = [r["params"][key] for r in rows]
        if key in ranges:
            xs = values
            ax.set_xscale("log" if ranges[key] else "linear")
        else:
            xs = _dodged(ax, values)
        errors = [r.get("ci95") or 0.0 for r in rows]
        ax.errorbar(xs, [r["value"] for r in rows], yerr=errors, fmt="o", color="#4c78a8", ecolor="#9ecae9", capsize=3)
        ax.set_xlabel(key)
        ax.set_ylabel(objective)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save(fig, path)


def _dodged(ax: Any, values: list[Any]) -> list[float]:
    """Positions of grid values, evenly spaced and labelled; the j-th configuration at a
    value moved right by j small steps."""
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        values = [str(v) for v in values]
    labels = sorted(set(values))
    xs, seen = [], {}
    for v in values:
        j = seen[v] = seen.get(v, -1) + 1
        xs.append(labels.index(v) + 0.12 * (j - (values.count(v) - 1) / 2))
    ax.set_xticks(range(len(labels)), [_short_label(v) for v in labels])
    ax.set_xlim(-0.5, max(len(labels), 1) - 0.5)
    return xs


def _short_label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot_staleness(table: dict[str, dict[Any, Any]], key: str, objective: str, title: str, path: Path) -> None:
    """Final objective against staleness, one line per algorithm (``table[algo][k]`` a
    :class:`~pipelines.sweeps.stats.SeedSummary`): the mean, with a 95% CI band where n > 1."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
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
    ticks = _spaced_ticks({k for by_k in table.values() for k in by_k})
    ax.set_xticks(ticks, [f"{k:g}" for k in ticks])  # every lag labelled (4 and 16 too), no two overlapping
    ax.xaxis.set_minor_locator(_null_locator())
    ax.set_xlabel(f"staleness ({key})")
    ax.set_ylabel(f"final {objective}")
    ax.grid(alpha=0.3)
    if table:
        _legend_beside(ax)
    ax.set_title(title, loc="left")
    save(fig, path)


def _spaced_ticks(values: set[Any], gap: float = 0.08) -> list[Any]:
    """The staleness values to label on a symlog axis, none within ``gap`` decades of
    another: whole numbers (the lags a sweep set) first, then measured means such as an
    in-flight arm's per-token staleness where there is room for them."""

    def at(k: Any) -> float:
        return math.log10(1.0 + abs(float(k)))

    kept: list[Any] = []
    for k in sorted(values, key=lambda v: (float(v) != int(float(v)), float(v))):
        if all(abs(at(k) - at(other)) >= gap for other in kept):
            kept.append(k)
    return sorted(kept, key=float)


def _null_locator() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def plot_study_curves(
    curves: dict[str, dict[Any, dict[Any, Any]]], objective: str, key: str, title: str, path: Path
) -> None:
    """A staleness sweep's curves: one row per metric (the objective against optimiser
    updates first, then per-step statistics), one column per staleness value, one line
    per objective: the seed mean with the seeds' range as a band."""
    plt = pyplot()
    metrics = list(curves)
    lags = sorted({k for by_k in curves.values() for k in by_k})
    labels = sorted({label for by_k in curves.values() for by_label in by_k.values() for label in by_label})
    colours = {label: f"C{i}" for i, label in enumerate(labels)}
    width = max(4.2 * len(lags), 10.0) + 2.0  # the legend beside
    fig, axes = plt.subplots(len(metrics), len(lags), figsize=(width, 2.8 * len(metrics)), squeeze=False, sharey="row")
    for row, metric in enumerate(metrics):
        for col, lag in enumerate(lags):
            ax = axes[row, col]
            for label, (xs, mean, low, high) in curves[metric].get(lag, {}).items():
                ax.plot(xs, mean, color=colours[label], label=label, lw=1.2)
                ax.fill_between(xs, low, high, color=colours[label], alpha=0.15, lw=0)
            if metric in ("policy/m2", "policy/ratio_max"):  # spans decades once data is stale
                ax.set_yscale("symlog", linthresh=1e-3)
            if row == 0:
                ax.set_title(f"{key} = {lag}")
            ax.set_xlabel("optimiser update" if metric == objective else "step")
            ax.set_ylabel(metric if col == 0 else "")
            ax.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", frameon=False)
    fig.suptitle(title + " (seed mean; band: seed range)")
    save(fig, path, dpi=100, rect=(0, 0, 1 - 2.0 / width, 1))
