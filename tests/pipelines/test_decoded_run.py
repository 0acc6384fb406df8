"""A run whose decoded reward hangs on some rows and raises on others finishes, with the
rows counted per step, and leaves no pool process behind."""

from __future__ import annotations

import psutil
import pytest
from mlflow import MlflowClient

from pipelines.run import run_experiment
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO

FLAKY = (
    "rewards=[{kind: decoded, scorer: 'tests.rewards.scorers:flaky', workers: 2, timeout_s: 0.1, "
    "timeout_score: -1.0, error_score: -0.5}]"
)


@pytest.fixture(autouse=True)
def _trusted(monkeypatch):  # type: ignore[no-untyped-def]
    """The scorer is the user's own module: they opted in (``--trust-code``)."""
    monkeypatch.setenv("ASYNCRLHF_TRUST_CODE", "1")


def test_a_hanging_and_raising_verifier_costs_rows_not_the_run(store):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    spec = load_spec(
        REPO / "experiments" / "quickstart.yaml",
        [
            FLAKY,
            "trainer.steps=4",
            "trainer.batch_size=32",
            "orchestrator.eval_every=2",
            "task.eval_size=20",
            "runtime.torch_threads=1",
        ],
    )
    result = run_experiment(spec)
    client = MlflowClient(store)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    timeouts = [m.value for m in client.get_metric_history(result.run_id, "reward/timeouts")]
    errors = [m.value for m in client.get_metric_history(result.run_id, "reward/errors")]
    assert len(timeouts) == len(errors) == 4  # every step reports both counts
    assert sum(timeouts) > 0 and sum(errors) > 0  # sums over 100 start with '1' (hang), 20-29 with '2' (raise)
    assert all(t + e <= 32 for t, e in zip(timeouts, errors, strict=True))
    # The pool's workers are gone; what multiprocessing keeps for the interpreter's life
    # (the fork server they were forked from, its resource tracker) may stay.
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and live(p)]
    assert all(p.ppid() == psutil.Process().pid for p in left), [p.cmdline() for p in left]
    assert all(
        "multiprocessing.forkserver" in " ".join(p.cmdline())
        or "multiprocessing.resource_tracker" in " ".join(p.cmdline())
        for p in left
    ), [p.cmdline() for p in left]


def live(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.nightly  # CI: the decoded reward's pool in one process
@pytest.mark.usefixtures("ray_cluster")
def test_on_ray_each_rollout_actor_scores_in_its_own_pool_and_counts_what_it_cost(store):
    often = FLAKY.replace("scorers:flaky", "scorers:often_flaky")  # a raise in about 4 of 10 rows
    spec = load_spec(
        REPO / "experiments" / "ray_async.yaml",
        [
            often,
            "trainer.steps=2",
            "trainer.batch_size=32",
            "orchestrator.eval_every=2",
            "task.eval_size=20",
        ],
    )
    result = run_experiment(spec)
    client = MlflowClient(store)
    assert client.get_run(result.run_id).info.status == "FINISHED"
    timeouts = [m.value for m in client.get_metric_history(result.run_id, "reward/timeouts")]
    errors = [m.value for m in client.get_metric_history(result.run_id, "reward/errors")]
    assert len(timeouts) == len(errors) == 2 and sum(timeouts) > 0 and sum(errors) > 0
    accuracy = client.get_metric_history(result.run_id, "eval/accuracy")
    assert [m.step for m in accuracy] == [0, 2]  # the held-out evaluation, judged by the same scorer, finished
