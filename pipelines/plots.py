"""PNG plots of a run: learning curves and the rollout/trainer timeline (Gantt)."""

from __future__ import annotations

from pathlib import Path

from asyncrlhf.orchestration import RunHistory

__all__ = ["plot_curves", "plot_timeline"]

_PHASE_COLOURS = {
    "generate": "#4c78a8",
    "reward": "#72b7b2",
    "load_weights": "#b279a2",
    "train": "#f58518",
    "publish": "#e45756",
    "eval": "#54a24b",
    "wait": "#dddddd",
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
