"""Runs on the vLLM engine: the quick start through the real CLI and MLflow store (lagged,
then resumed), async on the local runtime, and two vLLM rollout actors on Ray. Where vLLM
is installed (``scripts/test-vllm.sh``); elsewhere they skip, saying so."""

from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from asyncrlhf.rollout.vllm import vllm_available
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO, cli, env

pytestmark = pytest.mark.skipif(
    not vllm_available(), reason="vLLM is not installed here (bash scripts/setup-vllm.sh makes .venv-vllm)"
)
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
ON_VLLM = [
    "rollout.engine=vllm",
    "rollout.vllm={enforce_eager: true, max_model_len: 64}",
    "trainer.batch_size=128",
    "orchestrator.eval_every=5",
    "trainer.checkpoint_every=5",
]


def run_cli(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([*cli(), "run", *args], capture_output=True, text=True, env=env(), timeout=600)


def sets(*overrides: str) -> list[str]:
    return [arg for s in (*ON_VLLM, *overrides) for arg in ("--set", s)]


def test_a_lagged_cli_run_on_vllm_starts_at_the_shipped_accuracy_and_resumes(store):
    first = run_cli(str(QUICKSTART), *sets("trainer.steps=10"))
    assert first.returncode == 0, first.stderr[-3000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    accuracy = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/accuracy")}
    assert accuracy[0] == 0.405  # the shipped checkpoint's greedy accuracy, as on the HF engine
    (gap,) = client.get_metric_history(run.info.run_id, "rollout/logprob_gap")  # step 1: version 0's data at 0
    assert gap.step == 1 and gap.value < 1e-4  # vLLM's behaviour log-probs against the trainer's, float32
    resumed = run_cli(str(QUICKSTART), "--resume", run.info.run_id, *sets("trainer.steps=15"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean"))
    assert steps == list(range(1, 16))  # each step once, across the resume
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.parametrize("inflight", [None, "{chunk_tokens: 2}"])
def test_an_async_run_on_vllm_keeps_the_staleness_bound(inflight):
    """Whole batches, and the continuous stream with weights loaded between decode steps."""
    from pipelines.run import run_experiment

    overrides = [*ON_VLLM, "orchestrator.mode=async", "buffer.max_staleness=1", "trainer.steps=10"]
    overrides += [f"orchestrator.inflight={inflight}"] if inflight else []
    history = run_experiment(load_spec(QUICKSTART, overrides), track=False).history
    taus = [tau for step in history.staleness for tau in step]
    assert len(history.staleness) == 10 and max(taus) <= 1
    assert max(s["staleness/token_max"] for s in history.steps) <= 1
    assert history.final()["reward/mean"] > 0


@pytest.mark.usefixtures("ray_cluster")
def test_two_vllm_rollout_actors_on_ray_load_every_version_they_generate_with():
    from pipelines.run import build_runtime

    overrides = [*ON_VLLM, "runtime.kind=ray", "rollout.workers=2", "trainer.steps=6", "trainer.checkpoint_every=0"]
    orchestrator = build_runtime(load_spec(QUICKSTART, overrides))
    try:
        history = orchestrator.run(6)
    finally:
        orchestrator.close()
    assert {r.worker for r in orchestrator.weight_log} == {"rollout-0", "rollout-1"}
    assert {tau for step in history.staleness[1:] for tau in step} == {1}  # lagged k = 1
