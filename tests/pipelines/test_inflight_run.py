"""An in-flight run through the CLI: the exact variant's mixed-version data, measured in MLflow."""

from __future__ import annotations

from mlflow import MlflowClient


def test_an_exact_in_flight_run_logs_its_mixed_data_and_resumes_exactly(store, tmp_path):
    """Lagged k = 2, each batch moving one version on at response position 2: per-token
    staleness and the log-prob gap in MLflow; stopped at step 8 and resumed to 12, the
    same curves and final policy as the run that was never stopped."""
    from tests.pipelines.test_resume import asyncrlhf, curve, policy_sha, runs, write_spec

    inflight = {"mode": "lagged", "lag": 2, "eval_every": 4, "inflight": {"switch_at": [2], "kv": "recompute"}}
    whole = write_spec(tmp_path, orchestrator=inflight, trainer={**SPEC_TRAINER, "steps": 12})
    part = write_spec(tmp_path, orchestrator=inflight, trainer={**SPEC_TRAINER, "steps": 8})
    for spec in (whole, part):
        done = asyncrlhf("run", str(spec))
        assert done.returncode == 0, done.stderr[-2000:]
    reference, stopped = (r.info.run_id for r in runs(store))
    values = {k: [v for _, v in curve(store, reference, k)] for k in ("staleness/max", "staleness/token_mean")}
    # from step 3 on, batch n's first two tokens are version n − 2's, the rest version n − 1's
    assert values["staleness/max"][2:] == [2.0] * 10 and all(1.0 <= t < 2.0 for t in values["staleness/token_mean"][2:])
    assert all(f > 0.5 for _, f in curve(store, reference, "staleness/mixed_frac")[2:])  # longer than 2 tokens: mixed
    ((step, gap),) = curve(store, reference, "rollout/logprob_gap")  # only step 1 has tokens of the trainer's version
    assert step == 1 and gap < 1e-5  # the same weights in engine and trainer, float32
    params = MlflowClient(store).get_run(reference).data.params
    assert params["orchestrator.inflight.switch_at"] == "[2]" and params["orchestrator.inflight.kv"] == "recompute"
    resumed = asyncrlhf("resume", stopped, "--set", "trainer.steps=12")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for key in ("loss/policy", "reward/mean", "eval/accuracy", "staleness/token_mean", "staleness/mixed_frac"):
        got, want = curve(store, stopped, key), curve(store, reference, key)
        assert got == want and len(got) == (4 if key == "eval/accuracy" else 12), key  # eval: steps 0, 4, 8, 12
    assert policy_sha(store, stopped, tmp_path) == policy_sha(store, reference, tmp_path)


SPEC_TRAINER = {"batch_size": 64, "lr": 3.0e-4, "checkpoint_every": 4}
