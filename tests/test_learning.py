"""Real learning on the CPU: RL lifts held-out accuracy of the shipped start checkpoint.

Every run starts from the shipped checkpoint (40.5% greedy accuracy on the 200 fixed
held-out 2-digit additions, identical weights on every machine) and trains through
the real orchestrator in ``lagged`` mode with k = 1: rollout and training run
concurrently and every batch is exactly one version stale (off-policy, as in async),
yet each run is deterministic on a given CPU.

Float kernels still differ between CPUs, so a run's path does too, and real CPUs differ
more than kernel emulation shows (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``,
``ONEDNN_MAX_CPU_ISA``: see ``pipelines/bench/learning.py``). Each test runs one cell, seed 0
on this machine's kernels, of a setting whose gain is large against its spread; SPREAD
records what was measured, on emulated kernels and on real CPUs, and each threshold sits
below the worst cell by more than the largest drop seen between real CPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.run import run_experiment
from pipelines.spec import load_spec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
START = 0.405  # the shipped checkpoint's documented greedy accuracy
LAGGED = ["orchestrator.mode=lagged", "orchestrator.lag=1"]  # the quick start's own mode; the Ray test sets it

# (overrides on quickstart.yaml, the gain the test asserts); SPREAD is the measured basis of each threshold.
SETTINGS = {
    # The quick start's schedule (lr 4.5e-4, 8% warm-up, cosine decay; lagged k = 1, one
    # torch thread) over 500 steps, with M2PO's own token-mean aggregation.
    "m2po": (
        ["algorithm.name=m2po", "algorithm.loss_agg=token-mean", "trainer.steps=500", "orchestrator.eval_every=500"],
        0.06,
    ),
}
SPREAD = {
    # pipelines.bench.learning.run_in_subprocess(kernels, seed, SETTINGS["m2po"][0], QUICKSTART), one cell each
    "m2po": "Xeon with AMX (AVX512), 2026-12-01: seed 0 +17.5 native / +15.0 avx2 / +17.0 default, seed 1 +16.5 "
    "native. Across real CPUs, the earlier setting (addition.yaml, constant lr 2e-4) fell from +18.0 (AMD EPYC, "
    "AVX2) to +9.5 (AMD EPYC, AVX512 without AMX): a drop of 8.5 that kernel emulation did not show. Threshold "
    "+6: the worst cell (+15.0) less that drop, less margin",
}


# GRPO is tests/pipelines/test_quickstart.py (the quick start itself, threshold from its
# own kernel × seed matrix): not run twice.
@pytest.mark.nightly  # CI: learning is the quick start's; M2PO's loss against the paper's rule (tests/losses)
@pytest.mark.parametrize("algorithm", ["m2po"])
def test_rl_lifts_held_out_accuracy_from_the_shipped_start(algorithm):
    overrides, threshold = SETTINGS[algorithm]
    spec = load_spec(REPO / "experiments" / "quickstart.yaml", overrides)
    history = run_experiment(spec, track=False).history
    start = history.initial_metrics["eval/accuracy"]
    ((_, final),) = history.metric("eval/accuracy")
    print(f"{algorithm}: held-out accuracy {start:.3f} -> {final:.3f} (measured spread: {SPREAD[algorithm]})")
    assert start == START  # identical start on every machine
    assert final - start >= threshold
    assert {tau for step in history.staleness[1:] for tau in step} == {1}


@pytest.mark.nightly  # CI: the Ray runtime (tests/distributed) and learning (the quick start)
@pytest.mark.usefixtures("ray_cluster")
def test_rl_on_ray_with_two_rollout_actors_lifts_held_out_accuracy():
    """The same learning through the Ray runtime: two rollout actors, one trainer actor,
    lagged k = 1 (chunks are seeded by position, so the run is deterministic)."""
    from pipelines.run import build_runtime

    schedule = ["trainer.lr=4.5e-4", "trainer.warmup_ratio=0.08", "trainer.lr_decay=cosine"]  # the quick start's
    spec = load_spec(
        REPO / "experiments" / "ray_async.yaml",
        [*LAGGED, *schedule, "trainer.steps=200", "orchestrator.eval_every=200"],
    )
    orchestrator = build_runtime(spec)
    try:
        history = orchestrator.run(200)
    finally:
        orchestrator.close()
    start = history.initial_metrics["eval/accuracy"]
    ((_, final),) = history.metric("eval/accuracy")
    print(f"ray grpo: held-out accuracy {start:.3f} -> {final:.3f} in {history.summary['time/total_s']:.0f} s")
    assert start == START
    # Measured: 40.5% -> 53.0% (+12.5) in 133 s (with other tests alongside; AMD EPYC, with the
    # quick start's schedule; the constant lr 3e-4 gave +6.0 there and +12.5 on the Xeon), native
    # kernels only (Ray actors were not run under the kernel emulation): hence the wide margin.
    assert final - start >= 0.05
    assert {tau for step in history.staleness[1:] for tau in step} == {1}
    assert {r.worker for r in orchestrator.weight_log} == {"rollout-0", "rollout-1"}
