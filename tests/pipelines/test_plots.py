"""Run plots stay readable: titled with the run, a timeline aggregated past a few hundred
events, a staleness plot."""

from __future__ import annotations

import pytest

from asyncrlhf.orchestration import RunHistory
from asyncrlhf.orchestration.history import TimelineEvent
from pipelines.tracking import plot_title
from pipelines.tracking.plots import _shares, plot_run_staleness, plot_timeline


class Axis:
    """Records what ``_shares`` would draw."""

    def stackplot(self, xs, layers, colors):  # type: ignore[no-untyped-def]
        self.xs, self.layers = xs, layers

    def set_ylim(self, *args):  # type: ignore[no-untyped-def]
        pass


def test_time_shares_per_bin_add_up_to_the_busy_fraction():
    # 0–6 s generate, 6–8 s idle, 8–10 s train: in 5 bins of 2 s, shares 1, 1, 1, 0, 1.
    events = [TimelineEvent("rollout-0", "generate", 0.0, 6.0), TimelineEvent("rollout-0", "train", 8.0, 10.0)]
    ax = Axis()
    _shares(ax, events, ["generate", "train"], origin=0.0, end=10.0, bins=5)
    generate, train = ax.layers
    assert generate.tolist() == pytest.approx([1, 1, 1, 0, 0]) and train.tolist() == pytest.approx([0, 0, 0, 0, 1])


def test_long_runs_get_an_aggregated_timeline_and_every_run_a_staleness_plot(tmp_path):
    history = RunHistory(mode="async")
    history.timeline = [
        TimelineEvent(w, p, i * 0.1, i * 0.1 + 0.05)
        for i in range(400)
        for w, p in (("rollout-0", "generate"), ("trainer", "train"))
    ]
    history.steps = [
        {"step": float(i), "staleness/mean": 1.0, "staleness/max": 1.0, "staleness/updates": 4.0} for i in range(1, 11)
    ]
    title = plot_title(
        "quickstart·lr=0.0001",
        {"algorithm.name": "grpo", "orchestrator.mode": "async", "buffer.max_staleness": "1", "trainer.lr": "0.0001"},
    )
    assert title == "quickstart·lr=0.0001 — grpo, async (max_staleness 1), lr 0.0001"
    plot_timeline(history, tmp_path / "timeline.png", title)  # 800 events: shares per bin
    plot_run_staleness(history, tmp_path / "staleness.png", title)
    assert (tmp_path / "timeline.png").stat().st_size > 10_000 and (tmp_path / "staleness.png").stat().st_size > 10_000
