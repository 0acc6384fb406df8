"""Seed summaries: the t quantile and the interval, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from pipelines.sweeps.stats import summarize, t_quantile_975


def test_t_quantiles_match_the_tables_and_approach_the_normal():
    # Standard tables: t(0.975; 1) = 12.706, t(0.975; 4) = 2.776, t(0.975; 30) = 2.042;
    # t(0.975; 40) = 2.021 and t(0.975; 120) = 1.980; the normal's is 1.960.
    for df, table in ((1, 12.706), (4, 2.776), (30, 2.042)):
        assert t_quantile_975(df) == pytest.approx(table, abs=5e-4)
    assert t_quantile_975(40) == pytest.approx(2.021, abs=1e-3)
    assert t_quantile_975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


def test_summary_of_five_seeds():
    # mean 0.3; deviations −0.1, −0.05, 0, 0.05, 0.1 → Σd² = 0.025, std = √(0.025/4) = 0.0790569;
    # ci95 = 2.7764451 · 0.0790569 / √5 = 0.0981623.
    s = summarize([0.2, 0.25, 0.3, 0.35, 0.4])
    assert (s.mean, s.n) == (pytest.approx(0.3), 5)
    assert s.std == pytest.approx(0.0790569, abs=1e-7) and s.ci95 == pytest.approx(0.0981623, abs=1e-6)
    assert str(s) == "0.3000 ± 0.0982 (n=5)"


def test_one_value_has_no_interval_and_none_is_an_error():
    s = summarize([0.5])
    assert (s.mean, s.std, s.n) == (0.5, 0.0, 1) and math.isnan(s.ci95)
    with pytest.raises(ValueError, match="no values"):
        summarize([])
