"""``trend.png``: each gated benchmark figure over the suite's runs, one small panel each,
with its baseline and its limit drawn, every value past the limit marked red (the panel
of a figure this run regressed titled red too) and the newest run labelled by commit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pipelines.tracking.plots import pyplot, save

__all__ = ["Gated", "plot_trend"]

RED, GREY, LINE = "#cf222e", "#6e7781", "#4c78a8"


@dataclass(frozen=True)
class Gated:
    """A gated figure's reference: its baseline, its limit and which way is better."""

    baseline: float
    limit: float
    better: str  # "higher" or "lower"

    def past_limit(self, value: float) -> bool:
        return value < self.limit if self.better == "higher" else value > self.limit


def plot_trend(
    series: dict[str, list[float | None]], labels: list[str], gated: dict[str, Gated], title: str, path: Path
) -> None:
    """One panel per figure of ``gated`` (its values in ``series``, one per run, oldest
    first; None where not measured); ``labels`` name the runs (their commits)."""
    plt = pyplot()
    names = [name for name in gated if name in series]
    cols = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.5 * rows + 0.8), squeeze=False)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        ref, values = gated[name], series[name]
        xs = [i for i, v in enumerate(values) if v is not None]
        ys = [values[i] for i in xs]
        ax.plot(xs, ys, "-", color=LINE, lw=1.2)
        bad = [(x, y) for x, y in zip(xs, ys, strict=True) if ref.past_limit(y)]
        good = [(x, y) for x, y in zip(xs, ys, strict=True) if not ref.past_limit(y)]
        for points, colour in ((good, LINE), (bad, RED)):
            if points:
                ax.plot(*zip(*points, strict=True), "o", color=colour, ms=4)
        ax.axhline(ref.baseline, color=GREY, ls="--", lw=1)
        ax.axhline(ref.limit, color=RED, ls=":", lw=1.2)
        if xs:  # the newest run, by commit
            ax.annotate(labels[xs[-1]], (xs[-1], ys[-1]), xytext=(-4, 6), textcoords="offset points", ha="right")
        regressed = bool(values) and values[-1] is not None and ref.past_limit(values[-1])
        ax.set_title(name.removeprefix("bench/"), loc="left", color=RED if regressed else "black")
        ax.set_xticks([])
        ax.set_xlim(-0.5, max(len(values) - 0.5, 0.5))
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], color=GREY, ls="--", label="baseline"),
        plt.Line2D([], [], color=RED, ls=":", label="limit"),
        plt.Line2D([], [], color=RED, marker="o", ls="", label="past the limit"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"{title} (runs oldest → newest)")
    save(fig, path, dpi=100, rect=(0, 0.06, 1, 1))
