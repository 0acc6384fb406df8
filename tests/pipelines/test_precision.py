"""``model.dtype``: a float64 run is float64 from the loaded weights to the trainer's
log-probs, and the memory estimate counts its 8 bytes a number."""

from __future__ import annotations

import torch

from pipelines.run import build_runtime
from pipelines.spec import load_spec
from pipelines.spec.memory import estimate_bytes, weight_bytes
from tests.pipelines.conftest import REPO

SPEC = REPO / "experiments" / "quickstart.yaml"
SMALL = ["trainer.batch_size=32", "task.eval_size=10", "orchestrator.eval_every=0", "runtime.torch_threads=1"]


def test_a_float64_run_trains_and_generates_in_float64():
    runtime = build_runtime(load_spec(SPEC, [*SMALL, "model.dtype=float64"]))
    try:
        history = runtime.run(3)
        assert {p.dtype for p in runtime.trainer.model.parameters()} == {torch.float64}
        assert {p.dtype for p in runtime.engine.model.parameters()} == {torch.float64}
        assert {t.dtype for t in runtime.policy_state().values()} == {torch.float64}
    finally:
        runtime.close()
    # The engine computes log-probs in float64 and records them in float32 (the Experience
    # contract); the trainer recomputes them in float64 with the weights that sampled them:
    # they differ by float32's rounding of the log-prob alone, |log p| · 2^-24 (a float32
    # model's engine and trainer also differ by their kernels' rounding, up to ~1e-6)
    gaps = [s["rollout/logprob_gap_max"] for s in history.steps if "rollout/logprob_gap_max" in s]
    assert gaps and max(gaps) < 5e-7
    assert all(s["reward/mean"] >= 0 for s in history.steps)


def test_the_memory_estimate_counts_eight_bytes_a_number_in_float64():
    single, double = load_spec(SPEC), load_spec(SPEC, ["model.dtype=float64"])
    assert weight_bytes(double) == 2 * weight_bytes(single)
    assert estimate_bytes(double)["batch"] == 2 * estimate_bytes(single)["batch"]
