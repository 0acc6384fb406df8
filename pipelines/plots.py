"""PNG plots: a run's learning curves and rollout/trainer timeline (Gantt); a sweep's objective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrlhf.orchestration import RunHistory

__all__ = ["plot_curves", "plot_objective", "plot_staleness", "plot_timeline"]

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


def plot_curves(history: RunHistory, path: Path) -> None:
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
    ax.set_title(f"{history.mode}: reward and held-out accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(history: RunHistory, path: Path) -> None:
    """What each worker did when: one row per worker, one colour per phase."""
    plt = _pyplot()
    events = history.timeline
    fig, ax = plt.subplots(figsize=(10, 2.6))
    if events:
        origin = min(e.start for e in events)
        workers = sorted({e.worker for e in events})
        for row, worker in enumerate(workers):
            for phase, colour in _PHASE_COLOURS.items():
                spans = [(e.start - origin, e.end - e.start) for e in events if (e.worker, e.phase) == (worker, phase)]
                if spans:
                    ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=colour, label=phase if row == 0 else None)
        ax.set_yticks(range(len(workers)), workers)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _PHASE_COLOURS.values()]
        ax.legend(handles, list(_PHASE_COLOURS), ncol=len(_PHASE_COLOURS), fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.3))  # fmt: skip
    ax.set_xlabel("seconds since start")
    ax.set_title(f"{history.mode}: timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        ax.set_xlabel(key)
        ax.set_ylabel(objective)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_staleness(table: dict[str, dict[Any, Any]], key: str, objective: str, title: str, path: Path) -> None:
    """Final objective against staleness, one line per algorithm (``table[algo][k]`` a
    :class:`~pipelines.stats.SeedSummary`): the mean, with a 95% CI band where n > 1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, by_k in table.items():
        ks = list(by_k)
        means = [s.mean for s in by_k.values()]
        half = [s.ci95 if s.n > 1 else 0.0 for s in by_k.values()]
        (line,) = ax.plot(ks, means, "o-", label=algo)
        if any(half):
            lows = [m - h for m, h in zip(means, half, strict=True)]
            highs = [m + h for m, h in zip(means, half, strict=True)]
            ax.fill_between(ks, lows, highs, color=line.get_color(), alpha=0.2)
            ax.errorbar(ks, means, yerr=half, fmt="none", ecolor=line.get_color(), capsize=3)
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
