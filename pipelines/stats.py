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
from statistics import NormalDist

__all__ = ["SeedSummary", "summarize", "t_quantile_975"]

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (standard tables).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom.

    Tabled up to 30; beyond, the Cornish–Fisher expansion around the normal quantile
    (error below 1e-4 there).

    >>> t_quantile_975(2)
    4.303
    >>> round(t_quantile_975(60), 3)
    2.0
    """
    if df < 1:
        raise ValueError(f"df must be ≥ 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


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
