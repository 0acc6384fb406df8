from __future__ import annotations

import pytest
import torch

from asyncrlhf.orchestration import HeldOut, Orchestrator, RunConfig, Schedule, VersionManager
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.tasks import AdditionTask
from asyncrlhf.training import OptimConfig, TrainerWorker
from tests.helpers import even_first_token, small_model

VOCABULARY = {
    "reward/mean",
    "loss/policy",
    "loss/kl",
    "policy/clip_frac",
    "policy/ratio_max",
    "staleness/mean",
    "staleness/max",
    "buffer/size",
    "buffer/evicted_stale",
    "perf/samples_per_s",
    "perf/gen_tokens_per_s",
    "time/step_s",
    "staleness/updates",
}


def build(mode: str, steps_seed: int = 0, algorithm: str = "grpo", **kwargs) -> Orchestrator:  # type: ignore[no-untyped-def]
    model, tok = small_model(seed=steps_seed)
    task = AdditionTask(tok, digits=2, seed=0, eval_size=16)
    trainer = TrainerWorker(model, tok.pad_token_id, algorithm, optim=OptimConfig(lr=1e-2))
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=4), seed=1)
    fields = {"group_size": 4, "prompts_per_step": 4, "eval_every": 2}
    fields.update({k: kwargs.pop(k) for k in list(kwargs) if k in Schedule.__dataclass_fields__})
    config = RunConfig(
        Schedule(mode, **fields),
        task.train_problems(),
        even_first_token,
        tok.eos_token_id,
        tok.pad_token_id,
        HeldOut(task.eval_problems(), max_new_tokens=4),
        **kwargs,
    )
    return Orchestrator(engine, trainer, config)


def curve(history, key):  # type: ignore[no-untyped-def]
    return [s[key] for s in history.steps]


def test_lagged_k0_and_async_s0_reproduce_sync_exactly():
    sync = build("sync").run(6)
    lagged = build("lagged", lag=0).run(6)
    asynchronous = build("async", max_staleness=0).run(6)
    for key in ("reward/mean", "loss/policy"):
        assert curve(lagged, key) == curve(sync, key)
        assert curve(asynchronous, key) == curve(sync, key)
    assert any(v != 0 for v in curve(sync, "loss/policy"))  # not trivially equal
    assert sync.metric("eval/accuracy") == lagged.metric("eval/accuracy")


def test_lagged_k4_trains_on_data_exactly_4_versions_old():
    history = build("lagged", lag=4).run(9)
    for version, staleness in enumerate(history.staleness):
        assert set(staleness) == {min(version, 4)}
    assert history.steps[-1]["staleness/max"] == 4.0


def test_the_backlog_is_read_when_the_step_has_taken_its_batch():
    """``buffer/size`` is read once the step's batch is taken and before training: 0 in
    sync; in lagged k it is how far rollout ran ahead within the schedule (at most k
    batches), a timing figure, as in async."""
    assert set(curve(build("sync").run(5), "buffer/size")) == {0.0}
    for lag in (1, 3):
        assert max(curve(build("lagged", lag=lag).run(8), "buffer/size")) <= lag * 16


@pytest.mark.parametrize(("max_staleness", "publish_every"), [(1, 1), (2, 3)])
def test_async_respects_the_staleness_bound_and_accounts_for_everything(max_staleness, publish_every):
    orchestrator = build("async", max_staleness=max_staleness, publish_every=publish_every)
    history = orchestrator.run(8)
    trained = [tau for step in history.staleness for tau in step]
    assert len(trained) == 8 * 16 and max(trained) <= max_staleness
    stats = orchestrator.buffer.stats()
    assert stats["pushed"] == stats["sampled"] + stats["dropped_overflow"] + stats["evicted_stale"] + len(
        orchestrator.buffer
    )
    assert stats["sampled"] == len(trained)


def test_weight_sync_is_checksum_verified():
    orchestrator = build("async", max_staleness=1)
    orchestrator.run(4)
    engine, store = orchestrator.engine, orchestrator.weights
    assert engine.version >= 3
    assert engine.checksum() == store.find(engine.version, exact=True).checksum
    assert orchestrator.worker.weight_loads >= 4  # the forced initial load and later syncs


def test_a_corrupted_sync_fails_loudly():
    orchestrator = build("sync")
    original = orchestrator.engine.load_weights

    def corrupt(state, version):  # type: ignore[no-untyped-def]
        original({k: v + (1.0 if "norm" in k else 0.0) for k, v in state.items()}, version)

    orchestrator.engine.load_weights = corrupt
    with pytest.raises(RuntimeError, match="checksum"):
        orchestrator.run(2)


def test_metrics_timeline_and_callback():
    seen: list[tuple[int, set[str]]] = []
    history = build("async", max_staleness=1, on_metrics=lambda step, m: seen.append((step, set(m)))).run(4)
    assert [step for step, _ in seen] == [0, 1, 2, 3, 4]  # 0: the evaluation before any update, sent at once
    assert seen[0][1] == {"eval/accuracy"}
    assert set(history.steps[0]) >= VOCABULARY
    assert [s for s, _ in history.metric("eval/accuracy")] == [2, 4]
    assert "eval/accuracy" in history.initial_metrics
    assert 0.0 <= history.summary["perf/bubble_frac_rollout"] <= 1.0
    assert 0.0 <= history.summary["perf/bubble_frac_trainer"] <= 1.0
    workers = {e.worker for e in history.timeline}
    phases = {e.phase for e in history.timeline}
    assert workers == {"rollout-0", "trainer"} and {"generate", "train", "wait", "publish", "eval"} <= phases
    assert all(e.end >= e.start for e in history.timeline)


def test_a_failing_rollout_worker_surfaces_instead_of_hanging():
    orchestrator = build("async", max_staleness=1, timeout_s=30.0)
    calls = {"n": 0}
    generate = orchestrator.engine.generate

    def flaky(prompts, num_samples=1):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.cuda.OutOfMemoryError("simulated")
        return generate(prompts, num_samples)

    orchestrator.engine.generate = flaky
    with pytest.raises(RuntimeError, match="rollout worker failed"):
        orchestrator.run(10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "eager"}, "mode"),
        ({"mode": "async", "max_staleness": 0, "publish_every": 2}, "publish_every"),
        ({"group_size": 0}, "group_size"),
        ({"mode": "lagged", "lag": -1}, "lag"),
    ],
)
def test_bad_settings_fail_clearly(kwargs, match):
    mode = kwargs.pop("mode", "sync")
    with pytest.raises(ValueError, match=match):
        build(mode, **kwargs)


def test_the_schedule_says_which_weights_each_batch_uses_and_what_to_keep():
    lagged, asynchronous, sync = (
        Schedule("lagged", lag=3),
        Schedule("async", max_staleness=2, publish_every=3),
        Schedule(),
    )
    assert [lagged.required_version(n) for n in range(6)] == [0, 0, 0, 0, 1, 2] and lagged.exact
    assert lagged.keep == 5 and lagged.bound == 3
    assert [asynchronous.required_version(n) for n in range(5)] == [0, 0, 0, 1, 2] and not asynchronous.exact
    assert asynchronous.keep == 2 and [v for v in range(1, 10) if asynchronous.publishes_after(v)] == [3, 6, 9]
    assert sync.bound == 0 and all(sync.publishes_after(v) for v in range(1, 5))
    assert [s for s in range(6) if Schedule(eval_every=2).evaluates_after(s)] == [1, 3, 5]
    assert Schedule(prompts_per_step=4, lag=3, mode="lagged").make_buffer(VersionManager()).max_groups == 4 * 5


def test_staleness_is_also_logged_in_optimiser_updates():
    """Versions count trainer steps; ``staleness/updates`` counts optimiser updates
    (epochs × mini-batches per step), the M2PO paper's s."""
    from asyncrlhf.buffers import BoundedReplayBuffer
    from asyncrlhf.orchestration.schedule import train_on
    from tests.buffers.helpers import make_exp

    class Trainer:
        version, ppo_epochs, mini_batches = 5, 2, 4

        def step(self, experiences):  # type: ignore[no-untyped-def]
            return {}

    experiences = [make_exp(version=v) for v in (5, 4, 1)]  # staleness 0, 1, 4: mean 5/3
    metrics, staleness = train_on(Trainer(), experiences, BoundedReplayBuffer(4))
    assert staleness == [0, 1, 4] and metrics["staleness/mean"] == pytest.approx(5 / 3)
    assert metrics["staleness/updates"] == pytest.approx(8 * 5 / 3)
