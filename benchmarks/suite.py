"""The benchmark suite: cases, suites and targets, in one place.

Every figure is machine-independent: a ratio of two timings taken in the same run, a
share of a run's time, or a learning result as a mean over seeds from the shipped start
checkpoint. Timed figures are repeated and reported as median [min – max]. Each case
(``reward``, ``losses``, ``buffer``, ``pipeline``, ``step``, ``learning``, ``overhead``) is a
function of its parameters returning :class:`Figure` s; a suite is a set of cases with
parameters. ``asyncrlhf bench`` runs a suite and gates it against the committed
baseline (:mod:`pipelines.bench`); a figure's ``target`` is the design goal it should
reach, shown beside it, and is not what the gate compares.

Suites: ``quick`` (about 20 s, for tests and pre-merge checks), ``full`` (the
nightly run: the issue-sized workloads, async-vs-sync, and the quick-start learning
result as a mean over seeds), ``matrix`` (the learning result over emulated CPUs
too, which measures the spread its gate's slack is derived from) and ``cuda`` (the
reward and loss cases on the GPU).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = ["CASES", "SUITES", "TARGETS", "Figure", "environment", "run_suite"]

REPO = Path(__file__).resolve().parents[1]

# Design goals (a figure's ``target``): rewards on device at least 5× the per-row loop
# and 20× decoding, within 6× a bare pass over the tokens, no slower on adversarial input
# than the column scan; async at least 1.8× sync with the trainer idle ≤ 10% when
# rollout has its own device (the simulated latency setting); every M2PO mode within
# 1.5× PPO's forward+backward at 1M tokens.
TARGETS: dict[str, float] = {
    "reward.speedup_vs_loop": 5.0,
    "reward.speedup_vs_decode": 20.0,
    "reward.ratio_to_bare_pass": 6.0,
    "reward.adversarial_vs_scan": 0.9,
    "pipeline.latency.async_speedup": 1.8,
    "pipeline.latency.bubble_frac_trainer": 0.10,
    "checkpoint.cost_frac": 0.03,
    "losses.m2po_vs_ppo": 1.5,
    "losses.m2po_trust_region_vs_ppo": 1.5,
    "losses.m2po_token_vs_ppo": 1.5,
}
REWARD_FIGURES: dict[str, Literal["higher", "lower"]] = {
    "speedup_vs_loop": "higher",
    "speedup_vs_decode": "higher",
    "ratio_to_bare_pass": "lower",
    "adversarial_vs_scan": "higher",
}


@dataclass
class Figure:
    """One benchmark figure.

    ``tolerance`` is relative to the baseline (``--tolerance`` when None) unless
    ``absolute`` is set, in which case it is in the figure's own unit. ``gate=False``
    records an informational figure without gating on it.
    """

    name: str
    median: float
    min: float
    max: float
    better: Literal["higher", "lower"]
    unit: str = "×"
    tolerance: float | None = None
    absolute: bool = False
    gate: bool = True
    note: str = ""
    target: float | None = None  # what the figure should reach (informational; ``better`` says which side)

    @property
    def meets_target(self) -> bool | None:
        if self.target is None:
            return None
        return self.median >= self.target if self.better == "higher" else self.median <= self.target

    @classmethod
    def of(cls, name: str, values: list[float], better: Literal["higher", "lower"], **kwargs: Any) -> Figure:
        return cls(name, statistics.median(values), min(values), max(values), better, **kwargs)


Case = Callable[[dict[str, Any]], list[Figure]]


# ------------------------------------------------------------------------ cases
def _reward_case(params: dict[str, Any]) -> list[Figure]:
    from benchmarks import rewards

    figures, device = [], params.get("device", "cpu")
    for batch, length in params["shapes"]:
        runs = [rewards.run(batch, length, device=device, repeats=params["repeats"])["ratios"]
                for _ in range(params["rounds"])]  # fmt: skip
        tag = f"B{batch}_L{length}"
        for key, better in REWARD_FIGURES.items():
            target = TARGETS[f"reward.{key}"]
            figures.append(Figure.of(f"reward.{key}.{tag}", [r[key] for r in runs], better, target=target))
    return figures


def _losses_case(params: dict[str, Any]) -> list[Figure]:
    from benchmarks import losses

    device = params.get("device", "cpu")
    runs = [losses.run(params["tokens"], repeats=params["repeats"], device=device) for _ in range(params["rounds"])]
    names = ("m2po_vs_ppo", "m2po_trust_region_vs_ppo", "m2po_token_vs_ppo", "grpo_vs_ppo")
    at_size = params["tokens"] >= 1 << 20  # the target is set at 1M tokens; below, fixed costs dominate
    return [Figure.of(f"losses.{name}", [r[name] for r in runs], "lower", note="fwd+bwd time ratio",
                      target=TARGETS.get(f"losses.{name}") if at_size else None) for name in names]  # fmt: skip


def _decoded_case(params: dict[str, Any]) -> list[Figure]:
    from benchmarks import decoded

    runs = [decoded.run(params["batch"], tuple(params["workers"]), params["repeats"]) for _ in range(params["rounds"])]
    # Process scheduling on a shared machine swings these: reported, not gated.
    figures = [Figure.of(f"decoded.{name}", [r["ratios"][name] for r in runs], "higher", gate=False,
                         note="samples/s ratio, same batch") for name in runs[0]["ratios"]]  # fmt: skip
    for kind, rates in runs[0]["rates"].items():
        figures += [Figure.of(f"decoded.{kind}.{method}_per_s", [r["rates"][kind][method] for r in runs], "higher",
                              unit="/s", gate=False) for method in rates]  # fmt: skip
    return figures


def _buffer_case(params: dict[str, Any]) -> list[Figure]:
    from benchmarks import buffer

    results = buffer.run(params["items"], params["repeats"])
    # Six Python threads on one lock: GIL scheduling makes these ratios bimodal from run
    # to run (0.1× to 0.8× seen for identical code, in wall and in CPU time alike), so
    # they are reported, not gated. The accounting identity is asserted in every run.
    return [
        Figure(
            f"buffer.{name}_vs_deque",
            r["median"],
            r["min"],
            r["max"],
            "higher",
            gate=False,
            note="4 producers, 2 consumers",
        )
        for name, r in results.items()
    ]


def _pipeline_case(params: dict[str, Any]) -> list[Figure]:
    from benchmarks import pipeline

    figures = []
    for setting in params["settings"]:
        r = pipeline.run(setting, steps=params["steps"], repeats=params["repeats"])
        gate = setting == "latency"  # the in-process figure depends on core contention: informational
        s, b = r["speedup"], r["async"]["bubble_frac_trainer"]
        speedup, bubble = (TARGETS.get(f"pipeline.{setting}.{k}") for k in ("async_speedup", "bubble_frac_trainer"))
        figures += [
            Figure(f"pipeline.{setting}.async_speedup", s["median"], s["min"], s["max"], "higher", gate=gate,
                   target=speedup),
            Figure(f"pipeline.{setting}.bubble_frac_trainer", b["median"], b["min"], b["max"], "lower",
                   unit="", tolerance=0.05, absolute=True, gate=gate, target=bubble),
        ]  # fmt: skip
    return figures


def _step_case(params: dict[str, Any]) -> list[Figure]:
    """The quick start's step: generation with a shared prompt prefill, and training that
    reads each prompt once and leaves zero-advantage rows out, each against the way every
    row used to be paid for."""
    from benchmarks import step

    runs = [step.run(repeats=params["repeats"]) for _ in range(params["rounds"])]
    signal = runs[0]["signal_rows"]
    return [
        Figure.of("step.generate_shared_prefill_speedup", [r["generate_speedup"] for r in runs], "higher",
                  note=f"{step.PROMPTS} prompts × {step.GROUP} samples, 5 new tokens, 1 thread"),
        Figure.of("step.train_speedup", [r["train_speedup"] for r in runs], "higher",
                  note=f"shared prompts + zero-advantage rows left out; {signal:.0%} of rows with signal"),
        Figure.of("step.train_shared_prompts_speedup", [r["train_share_speedup"] for r in runs], "higher",
                  note="shared prompts alone"),
    ]  # fmt: skip


def _quickstart_spec(overrides: list[str], tracking_uri: str) -> Any:
    from pipelines.spec import load_spec

    return load_spec(REPO / "experiments" / "quickstart.yaml", [*overrides, f"tracking.uri={tracking_uri}"])


def _learning_case(params: dict[str, Any]) -> list[Figure]:
    """The quick start's accuracy gain over kernel settings × seeds (one subprocess each).

    Every cell starts from the shipped checkpoint; lagged k = 1 makes each cell
    deterministic, so the spread is that of seeds and CPU kernels, not thread timing.
    The gate is on the mean over the cells, which moves far less from machine to machine
    than one run (see ``LEARNING_SLACK``).
    """
    from benchmarks import learning

    result = learning.run_matrix(params["kernels"], params["seeds"], params["overrides"], log=print)
    figures = []
    overall = result["all"]
    note = f"mean of {overall['n']} cells: kernels {params['kernels']} × seeds {params['seeds']}"
    figures.append(Figure("learning.quickstart_accuracy_gain", overall["mean"], overall["min"], overall["max"],
                          "higher", unit="points", tolerance=LEARNING_SLACK, absolute=True, note=note))  # fmt: skip
    for name, k in result["by_kernels"].items():
        figures.append(Figure(f"learning.quickstart_accuracy_gain.{name}", k["mean"], k["min"], k["max"], "higher",
                              unit="points", gate=False, note=f"seeds {params['seeds']}"))  # fmt: skip
    times = [c["run_s"] for c in result["cells"]]
    figures.append(Figure.of("learning.quickstart_run_s", times, "lower", unit="s", gate=False, note="per cell"))
    return figures


def _overhead_case(params: dict[str, Any]) -> list[Figure]:
    """Share of the run spent in tracking, and in orchestration (sync mode: everything
    that is neither generating, rewarding, training nor evaluating), as CPU time of the
    loop's thread: in sync mode with one torch thread that thread does all the work, and
    CPU time, unlike wall time, does not grow when other processes take the cores (wall
    shares failed the gate at a load average of 5.8 on 2 cores)."""
    from pipelines.run import run_experiment

    tracking, orchestration = [], []
    overrides = [*params["overrides"], "orchestrator.mode=sync", "runtime.torch_threads=1"]
    with tempfile.TemporaryDirectory() as tmp:  # a first tracked run pays MLflow's one-off set-up: not measured
        run_experiment(_quickstart_spec([*overrides, "trainer.steps=2"], f"sqlite:///{tmp}/mlflow.db"))
    for _ in range(params["repeats"]):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_experiment(_quickstart_spec(overrides, f"sqlite:///{tmp}/mlflow.db"))
        history = result.history
        work = sum(e.cpu or 0.0 for e in history.timeline if e.phase in {"generate", "reward", "train", "eval"})
        loop_cpu = history.summary["time/loop_cpu_s"]
        share = result.final_metrics["perf/tracking_cpu_frac"]
        tracking.append(share)
        orchestration.append(max(0.0, 1.0 - work / loop_cpu - share))
    note = "CPU time of the loop's thread"
    return [
        Figure.of("overhead.tracking_frac", tracking, "lower", unit="", tolerance=0.02, absolute=True, note=note),
        Figure.of(
            "overhead.orchestration_frac", orchestration, "lower", unit="", tolerance=0.03, absolute=True, note=note
        ),
    ]


def _checkpoint_case(params: dict[str, Any]) -> list[Figure]:
    """Checkpoint writing as a share of run time, at the default interval
    (``trainer.checkpoint_every``), in lagged mode (its ring of stale snapshots included)."""
    from pipelines.run import run_experiment

    shares = []
    for _ in range(params["repeats"]):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_experiment(_quickstart_spec([*params["overrides"], *_LAGGED], f"sqlite:///{tmp}/mlflow.db"))
        shares.append(result.final_metrics["perf/checkpoint_frac"])
    target, note = TARGETS["checkpoint.cost_frac"], "share of run time spent writing checkpoints"
    return [Figure.of("checkpoint.cost_frac", shares, "lower", unit="", tolerance=0.02, absolute=True, target=target,
                      note=note)]  # fmt: skip


# Absolute slack of the gated learning figure (a mean gain over seeds), in accuracy
# points, derived from the spread measured by the `matrix` suite (3 kernel settings ×
# 3 seeds, 2026-12-01, AMD EPYC): per-kernel 3-seed means +24.2 (native AVX2), +24.2
# (avx2), +25.2 (SSE-only), so another machine's mean moves by D = 1.0 point; the cells'
# standard deviation is 2.0 points, so a 3-seed mean has a standard error of 1.2.
# D + 2 SE = 3.4 points, rounded up to 5: this quick start's matrix comes from one
# machine (the earlier one's moved by 1.0 point between the Xeon and the AMD EPYC).
LEARNING_SLACK = 0.05

CASES: dict[str, Case] = {
    "reward": _reward_case,
    "decoded": _decoded_case,
    "losses": _losses_case,
    "buffer": _buffer_case,
    "pipeline": _pipeline_case,
    "step": _step_case,
    "learning": _learning_case,
    "overhead": _overhead_case,
    "checkpoint": _checkpoint_case,
}

_SHORT = ["trainer.steps=20", "trainer.batch_size=128", "orchestrator.eval_every=0"]
_LAGGED = ["orchestrator.mode=lagged", "orchestrator.lag=1"]
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
        # The quick start as shipped (lagged k = 1: each cell deterministic on its CPU).
        # Three seeds on this machine's kernels.
        "learning": {"overrides": [], "kernels": ["native"], "seeds": [0, 1, 2]},
    },
    # The same learning figure over emulated CPUs (AVX2, SSE-only) too: 9 cells, about
    # 23 min on 2 cores (AMD EPYC). It measures the spread that LEARNING_SLACK is derived from.
    "matrix": {
        "learning": {"overrides": [], "kernels": ["native", "avx2", "default"], "seeds": [0, 1, 2]},
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
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=REPO, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
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
