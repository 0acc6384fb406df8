"""The benchmark suites: which cases (:mod:`pipelines.bench.cases`) run with which parameters.

Every figure is machine-independent: a ratio of two timings taken in the same run, a
share of a run's time, or a learning result as a mean over seeds from the shipped start
checkpoint. Timed figures are repeated and reported as median [min – max]. Each case
(``reward``, ``losses``, ``buffer``, ``pipeline``, ``step``, ``learning``, ``overhead``) is a
function of its parameters returning :class:`Figure` s; a suite is a set of cases with
parameters. ``asyncrlhf bench`` runs a suite and gates it against the committed
baseline (:mod:`pipelines.bench.gate`); a figure's ``target`` is the design goal it should
reach, shown beside it, and is not what the gate compares.

Suites: ``quick`` (about 20 s, for tests and pre-merge checks), ``full`` (the
nightly run: the issue-sized workloads, async-vs-sync, and the quick-start learning
result as a mean over seeds), ``matrix`` (the learning result over emulated CPUs
too, which measures the spread its gate's slack is derived from), ``ranks`` (a trainer
group's learning against one process's, paired over seeds) and ``cuda`` (the reward and
loss cases on the GPU).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from pipelines.bench.cases import CASES, TARGETS, Figure
from pipelines.tracking.names import git_commit

__all__ = ["CASES", "SUITES", "TARGETS", "Figure", "environment", "run_suite"]

REPO = Path(__file__).resolve().parents[2]  # the folder holding the pipelines package (a clone, or site-packages)

_SHORT = ["trainer.steps=20", "trainer.batch_size=128", "orchestrator.eval_every=0"]
SUITES: dict[str, dict[str, dict[str, Any]]] = {
    # Issue-sized inputs even in the quick suite: at small sizes fixed per-call costs
    # dominate and the ratios stop being stable enough to gate on.
    # The quick suite is the scheduled gate, which may share its machine: its timing cases
    # run on one torch thread. With another process on the cores, two OpenMP threads wait
    # at every barrier for a descheduled peer (PPO's step: 5 ms alone, 370 ms with a
    # second quick start running), which no choice of statistic survives; on one thread
    # every ratio held within 10% (measured on the Xeon, 2026-12-01).
    "quick": {
        "reward": {"shapes": [(256, 1024)], "repeats": 10, "rounds": 3, "threads": 1},
        "decoded": {"batch": 128, "workers": [2], "repeats": 2, "rounds": 1},
        "losses": {"tokens": 1 << 18, "repeats": 5, "rounds": 3, "threads": 1},
        "buffer": {"items": 60_000, "repeats": 5},
        # 60 steps: at the quick start's flush_every of 50, a 20-step run would flush only at step 0
        "overhead": {"overrides": [*_SHORT, "trainer.steps=60"], "repeats": 1},
        "checkpoint": {
            "overrides": ["trainer.steps=200", "trainer.batch_size=64", "orchestrator.eval_every=0"],
            "repeats": 1,
        },
    },
    "full": {
        "reward": {"shapes": [(256, 1024), (64, 256)], "repeats": 20, "rounds": 3},
        "decoded": {"batch": 256, "workers": [1, 2, 4], "repeats": 3, "rounds": 3},
        "losses": {"tokens": 1 << 20, "repeats": 5, "rounds": 3},
        "buffer": {"items": 200_000, "repeats": 5},
        "pipeline": {"settings": ["latency", "hf"], "steps": 30, "repeats": 3},
        "step": {"repeats": 10, "rounds": 3},
        "overhead": {"overrides": ["trainer.steps=50", "orchestrator.eval_every=0"], "repeats": 3},
        "checkpoint": {
            "overrides": ["trainer.steps=300", "trainer.batch_size=128", "orchestrator.eval_every=0"],
            "repeats": 1,
        },
        "weight_sync": {"sizes": [1_000_000, 10_000_000, 100_000_000], "receivers": 2, "repeats": 3},
        "sharded": {"worlds": [1, 2], "parallel": "fsdp"},
        "lora": {},
        "inflight": {"settings": ["latency", "hf"], "max_staleness": [1, 2], "steps": 20, "repeats": 3},
        "generation": {"prompts": 64, "samples": 8, "max_new_tokens": 32, "repeats": 3},  # vLLM's venv only
        # The quick start as shipped (lagged k = 1: each cell deterministic on its CPU).
        # Three seeds on this machine's kernels.
        "learning": {"overrides": [], "kernels": ["native"], "seeds": [0, 1, 2]},
    },
    # The same learning figure over emulated CPUs (AVX2, SSE-only) too: 9 cells, about
    # 23 min on 2 cores (AMD EPYC). It measures the spread that LEARNING_SLACK is derived from.
    "matrix": {
        "learning": {"overrides": [], "kernels": ["native", "avx2", "default"], "seeds": [0, 1, 2]},
    },
    # Does a trainer group learn as much as one process? The quick start per seed as one
    # trainer process, one reading rows whole (the control: rounding alone differs) and
    # two ranks, on the Ray runtime; the paired differences. About 11 min a seed (Xeon).
    "ranks": {
        "group_learning": {"overrides": [], "seeds": list(range(10))},
    },
    # The device-side claims on a GPU: rewards and losses at issue sizes, on CUDA tensors.
    "cuda": {
        "reward": {"shapes": [(256, 1024), (1024, 4096)], "repeats": 20, "rounds": 3, "device": "cuda"},
        "losses": {"tokens": 1 << 22, "repeats": 10, "rounds": 3, "device": "cuda"},
    },
}


# ------------------------------------------------------------------ environment
def _cpu_model() -> str | None:
    """The CPU's model name and whether it has AMX (which oneDNN uses where it can)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), None)
    return f"{model}{' (AMX)' if ' amx_tile' in info else ''}" if model else None


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    commit = git_commit(REPO)
    import transformers

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's kernels: DEFAULT, AVX2, AVX512…
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run_suite(suite: str, cases: list[str] | None = None, log: Callable[[str], None] = print) -> list[Figure]:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: choose one of {sorted(SUITES)}")
    if suite == "cuda" and not torch.cuda.is_available():
        raise ValueError("suite 'cuda' needs a CUDA device and torch.cuda.is_available() is False")
    selected = SUITES[suite]
    unknown = sorted(set(cases or []) - set(selected))
    if unknown:
        raise ValueError(f"suite {suite!r} has no case {unknown}: it has {sorted(selected)}")
    figures: list[Figure] = []
    for name, params in selected.items():
        if cases and name not in cases:
            continue
        start, threads = time.perf_counter(), torch.get_num_threads()
        torch.set_num_threads(params.get("threads", threads))
        try:
            figures += CASES[name]({key: value for key, value in params.items() if key != "threads"})
        finally:
            torch.set_num_threads(threads)
        log(f"  {name}: {time.perf_counter() - start:.1f} s")
    return figures
