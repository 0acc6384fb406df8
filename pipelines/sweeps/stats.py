"""Summaries over seeds: mean, standard deviation, 95% confidence interval, n.

A learning result is a mean over seeds with its spread, never one run. The interval is
Student's t (the seeds are few and their spread is estimated from them), so three
seeds give a wide interval, honestly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["SeedSummary", "summarize", "t_quantile_975"]


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t``).

    >>> round(t_quantile_975(2), 3), round(t_quantile_975(60), 3)
    (4.303, 2.0)
    """
    if df < 1:
        raise ValueError(f"df must be ≥ 1, got {df}")
    from scipy.stats import t

    return float(t.ppf(0.975, df))


@dataclass(frozen=True)
class SeedSummary:
    """Mean of n values with their sample standard deviation and the 95% CI half-width
    (``ci95`` is NaN and ``std`` 0 for a single value: no spread can be estimated)."""

    mean: float
    std: float
    ci95: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.mean:.4f} (n=1)"
        return f"{self.mean:.4f} ± {self.ci95:.4f} (n={self.n})"


def summarize(values: Sequence[float]) -> SeedSummary:
    """Mean, std (n − 1), 95% CI half-width and n of ``values``.

    >>> s = summarize([0.5, 0.6, 0.7])
    >>> round(s.mean, 3), round(s.std, 3), round(s.ci95, 3), s.n
    (0.6, 0.1, 0.248, 3)
    """
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = statistics.fmean(values)
    if n == 1:
        return SeedSummary(mean, 0.0, math.nan, 1)
    std = statistics.stdev(values)
    return SeedSummary(mean, std, t_quantile_975(n - 1) * std / math.sqrt(n), n)
