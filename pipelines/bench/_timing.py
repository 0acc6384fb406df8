"""Repeated wall-clock timing with device synchronisation; median, min and max."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median: float
    min: float
    max: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.median * 1e3:9.3f} ms  [{self.min * 1e3:.3f} – {self.max * 1e3:.3f}]"


def summarize(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated figures."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_interleaved(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int = 20,
    warmup: int = 2,
    budget_s: float = 60.0,
) -> dict[str, Timing]:
    """Time several functions in rounds (each once per round) so that drifting machine
    load affects them alike.

    Ratios between methods are best taken of their ``min``: the fastest round is the one
    least disturbed by other processes (as ``timeit`` advises), and a multi-threaded
    torch kernel is disturbed far more than a Python loop when another process takes a
    core (OpenMP threads wait at each barrier for a descheduled peer). With a second
    quick start alongside, the reward case's median-based speed-up fell from 6.1 to
    0.7–1.9 while its min-based one stayed at 6.1–6.5."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + budget_s
    rounds = 0
    while rounds < repeats and (rounds < 3 or time.perf_counter() < deadline):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            samples[name].append(time.perf_counter() - start)
        rounds += 1
    return {name: Timing(statistics.median(s), min(s), max(s), len(s)) for name, s in samples.items()}
