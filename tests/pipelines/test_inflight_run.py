"""An in-flight run through the CLI: the exact variant's mixed-version data, measured in MLflow."""

from __future__ import annotations

import subprocess

from mlflow import MlflowClient

from tests.pipelines.conftest import cli, env
from tests.pipelines.test_cli import QUICKSTART, SHORT, runs


def test_an_exact_in_flight_run_logs_per_token_staleness_and_the_logprob_gap(store):
    overrides = ["orchestrator.lag=2", "orchestrator.inflight={switch_at: [2]}", "runtime.torch_threads=1"]
    done = subprocess.run(
        [*cli(), "run", str(QUICKSTART), *SHORT, *(a for o in overrides for a in ("--set", o))],
        capture_output=True,
        text=True,
        env=env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = runs(store)
    client = MlflowClient(store)

    def curve(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    # from step 3 on, batch n's first two tokens are version n − 2's, the rest version n − 1's
    assert curve("staleness/max")[2:] == [2.0] * 4
    assert all(1.0 <= t < 2.0 for t in curve("staleness/token_mean")[2:])
    assert all(f > 0.5 for f in curve("staleness/mixed_frac")[2:])  # responses longer than 2 tokens are mixed
    gap = curve("rollout/logprob_gap")  # only where some tokens are the trainer's version: step 1
    assert len(gap) >= 1 and gap[0] < 1e-5  # the same weights in engine and trainer, float32
    assert run.data.params["orchestrator.inflight.switch_at"] == "[2]"


def test_a_resumed_exact_in_flight_run_repeats_the_uninterrupted_one(store, tmp_path):
    from tests.pipelines.test_resume import asyncrlhf, curve, policy_sha, runs, write_spec

    inflight = {"mode": "lagged", "lag": 2, "eval_every": 4, "inflight": {"switch_at": [2], "kv": "recompute"}}
    whole = write_spec(tmp_path, orchestrator=inflight, trainer={**SPEC_TRAINER, "steps": 12})
    part = write_spec(tmp_path, orchestrator=inflight, trainer={**SPEC_TRAINER, "steps": 8})
    for spec in (whole, part):
        done = asyncrlhf("run", str(spec))
        assert done.returncode == 0, done.stderr[-2000:]
    reference, stopped = (r.info.run_id for r in runs(store))
    resumed = asyncrlhf("resume", stopped, "--set", "trainer.steps=12")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for key in ("loss/policy", "reward/mean", "eval/accuracy", "staleness/token_mean", "staleness/mixed_frac"):
        got, want = curve(store, stopped, key), curve(store, reference, key)
        assert got == want and len(got) == (4 if key == "eval/accuracy" else 12), key  # eval: steps 0, 4, 8, 12
    assert curve(store, stopped, "staleness/token_mean")[-1][1] < 2.0  # the switch happened: tokens fresher than k
    assert policy_sha(store, stopped, tmp_path) == policy_sha(store, reference, tmp_path)


SPEC_TRAINER = {"batch_size": 64, "lr": 3.0e-4, "checkpoint_every": 4}
