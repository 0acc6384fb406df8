"""The in-flight bench case's bookkeeping (its figures are measured by the bench, not here)."""

from __future__ import annotations

from pipelines.bench import inflight


def test_the_inflight_bench_runs_every_mode_on_the_same_samples_and_reports_ratios():
    r = inflight.run("latency", steps=3, repeats=1, prompts=2, group=2, max_new_tokens=16, median=2.0)
    assert set(inflight.MODES) <= set(r) and r["max_staleness"] == 1
    for mode in inflight.MODES:
        assert r[mode]["samples_per_s"]["median"] > 0 and 0.0 <= r[mode]["bubble_frac_trainer"]["median"] <= 1.0
    ratio = r["inflight_vs_async"]["median"]
    assert ratio == r["inflight"]["samples_per_s"]["median"] / r["async"]["samples_per_s"]["median"]
    assert r["median_length"]["median"] <= r["p95_length"]["median"] <= 16
