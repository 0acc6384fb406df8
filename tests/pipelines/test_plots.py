"""Run plots stay readable: titled with the run, a timeline aggregated past a few hundred
events, a staleness plot."""

from __future__ import annotations

import pytest

from asyncrlhf.orchestration import RunHistory
from asyncrlhf.orchestration.history import TimelineEvent
from pipelines.tracking import plot_title, plots
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


LONG_TITLE = "lr=1e-4·lag=4·steps=40·batch=64·eval_every=5 — m2po, lagged (lag 4), lr 0.0001, a long experiment name"


@pytest.fixture
def drawn(monkeypatch):  # type: ignore[no-untyped-def]
    """Each figure the plots save, checked before it is written: no text outside it, none
    under 10 pt."""
    import pipelines.bench.trend as trend

    figures = []
    real = plots.save

    def checked(fig, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        figures.append(fig)
        plots._fit_titles(fig)  # as save does, before it writes
        fig.tight_layout(rect=kwargs.get("rect"))
        assert plots.overflow(fig) == [], path.name
        sizes = {t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_fontsize")) if t.get_text()}
        assert min(sizes) >= 10, path.name
        real(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "save", checked)
    monkeypatch.setattr(trend, "save", checked)
    return figures


def accuracy_history(values: list[float]) -> RunHistory:
    history = RunHistory(mode="lagged")
    history.initial_metrics = {"eval/accuracy": values[0]}
    history.steps = [{"step": float(i), "reward/mean": 0.4, "eval/accuracy": v} for i, v in enumerate(values[1:], 1)]
    return history


def test_titles_fit_fonts_are_readable_and_the_axis_shows_a_five_point_change(drawn, tmp_path):
    """curves.png cut its title inside the image and fixed the axis at 0–1, so a change of
    0.40 → 0.45 looked flat."""
    history = accuracy_history([0.40, 0.42, 0.45])
    plots.plot_curves(history, tmp_path / "curves.png", LONG_TITLE)
    plots.plot_run_staleness(history, tmp_path / "staleness.png", LONG_TITLE)
    curves = drawn[0].axes[0]
    low, high = curves.get_ylim()
    assert high - low < 0.5  # the data's range, not 0–1
    assert any(line.get_ydata()[0] == 0.40 and line.get_linestyle() == ":" for line in curves.lines)  # start marked
    assert "\n" in curves.get_title(loc="left")  # wrapped, not cut


def test_sweep_plots_label_every_lag_and_keep_error_bars_apart(drawn, tmp_path):
    from pipelines.sweeps.stats import summarize

    table = {a: {k: summarize([0.5, 0.6 + k / 100]) for k in (0, 1, 4, 16)} for a in ("grpo", "m2po")}
    plots.plot_staleness(table, "orchestrator.lag", "eval/accuracy", LONG_TITLE, tmp_path / "staleness.png")
    labels = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    assert labels == ["0", "1", "4", "16"]
    # In-flight arms at measured per-token staleness beside the lags: labelled only where
    # they do not print over a lag or one another (14.7 beside 16 did).
    table = {"a · none": {4.0: summarize([0.5]), 16.0: summarize([0.4])}}
    table["a · switch"] = {2.67: summarize([0.5]), 14.7: summarize([0.4])}
    table["b · switch"] = {2.69: summarize([0.5]), 14.68: summarize([0.4])}
    plots.plot_staleness(table, "mean per-token", "eval/accuracy", LONG_TITLE, tmp_path / "inflight.png")
    assert [t.get_text() for t in drawn[-1].axes[0].get_xticklabels()] == ["2.67", "4", "16"]
    rows = [{"params": {"lag": k, "algorithm": a}, "value": 0.5, "ci95": 0.1} for k in (0, 4) for a in ("x", "y")]
    plots.plot_objective(rows, ["lag", "algorithm"], "eval/accuracy", {}, LONG_TITLE, tmp_path / "objective.png")
    lag_panel = drawn[-1].axes[0]
    xs = sorted(x for line in lag_panel.lines for x in line.get_xdata())
    assert len(set(xs)) == 4 and [t.get_text() for t in lag_panel.get_xticklabels()] == ["0", "4"]


def test_the_trend_marks_an_injected_regression(drawn, tmp_path):
    """trend.png was 21 stacked panels with no baseline or limit: a regressed
    orchestration_frac (0.120 against a limit of 0.106) looked like an improvement."""
    from pipelines.bench.trend import RED, Gated, plot_trend

    gated = {
        "bench/overhead/orchestration_frac": Gated(0.088, 0.106, "lower"),
        "bench/step/speed": Gated(2.0, 1.6, "higher"),
    }
    series = {"bench/overhead/orchestration_frac": [0.09, 0.087, 0.120], "bench/step/speed": [2.1, None, 2.0]}
    plot_trend(series, ["aaaaaaa", "bbbbbbb", "ccccccc"], gated, "benchmark suite quick", tmp_path / "trend.png")
    overhead, speed = drawn[0].axes[:2]
    assert overhead._left_title.get_color() == RED and speed._left_title.get_color() != RED  # the regressed one
    red = [line for line in overhead.lines if line.get_marker() == "o" and line.get_color() == RED]
    assert [list(line.get_ydata()) for line in red] == [[0.120]]
    assert {line.get_ydata()[0] for line in overhead.lines if line.get_linestyle() in ("--", ":")} == {0.088, 0.106}
    assert [t.get_text() for t in overhead.texts] == ["ccccccc"]  # the newest run's commit
