"""The Ray runtime on a real local 2-CPU cluster: two rollout actors, one trainer actor."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncrlhf.models import pretrained_policy
from pipelines.run import build_runtime
from pipelines.run.warmstart import greedy_accuracy
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_cluster")

SPEC = REPO / "experiments" / "ray_async.yaml"
SMALL = ["trainer.batch_size=64", "task.eval_size=20", "orchestrator.eval_every=5"]


def build(*overrides: str, on_metrics=None):  # type: ignore[no-untyped-def]
    return build_runtime(load_spec(SPEC, [*SMALL, *overrides]), on_metrics=on_metrics)


def accounting_holds(stats: dict[str, int]) -> bool:
    return stats["pushed"] == stats["sampled"] + stats["dropped_overflow"] + stats["evicted_stale"] + stats["size"]


@pytest.mark.parametrize(("mode", "bound"), [("async", 1), ("lagged", 2)])
def test_two_workers_train_with_verified_weights_and_bounded_staleness(mode, bound):
    override = f"buffer.max_staleness={bound}" if mode == "async" else f"orchestrator.lag={bound}"
    orch = build(f"orchestrator.mode={mode}", override, "trainer.steps=10")
    try:
        history = orch.run(10)
        stats = orch.buffer_stats()
        final_checksum = orch.trainer_checksums[10]
    finally:
        orch.close()
    # Trained: ten versions, each published once with a distinct checksum.
    assert len(history.steps) == 10 and all(s["loss/policy"] == s["loss/policy"] for s in history.steps)
    assert sorted(orch.trainer_checksums) == list(range(11)) and len(set(orch.trainer_checksums.values())) == 11
    assert final_checksum != orch.trainer_checksums[0]
    # Both workers generated, with several versions, each load matching the trainer's checksum.
    by_worker = {r.worker for r in orch.weight_log}
    assert by_worker == {"rollout-0", "rollout-1"}
    assert len(orch.weight_log) == 2 * 10  # one chunk per worker per batch, none lost
    assert all(r.checksum == r.trainer_checksum == orch.trainer_checksums[r.version] for r in orch.weight_log)
    for worker in by_worker:
        assert len({r.version for r in orch.weight_log if r.worker == worker}) >= 3
    # The staleness bound holds for every trained experience (exactly k in lagged mode).
    for step, taus in enumerate(history.staleness):
        assert len(taus) == 64 and max(taus) <= bound
        if mode == "lagged":
            assert set(taus) == {min(step, bound)}
    assert stats["pushed"] == 10 * 64 and stats["sampled"] == 10 * 64 and accounting_holds(stats)
    # The trainer actor evaluates the shipped checkpoint exactly as a local greedy pass does.
    start = greedy_accuracy(pretrained_policy(), load_spec(SPEC, SMALL))
    assert history.initial_metrics["eval/accuracy"] == start and "eval/accuracy" in history.steps[4]
    assert history.summary["faults/rollout_restarts"] == 0


def run_to_end(steps: int, *overrides: str, on_metrics=None):  # type: ignore[no-untyped-def]
    orch = build(f"trainer.steps={steps}", "orchestrator.eval_every=0", *overrides, on_metrics=on_metrics)
    try:
        return orch, orch.run(steps), orch.buffer_stats()
    finally:
        orch.close()


def test_a_killed_rollout_actor_restarts_and_the_run_finishes(ray_cluster):
    ray = ray_cluster
    lagged = ("orchestrator.mode=lagged", "orchestrator.lag=1")
    state: dict = {}

    def kill_at_step_3(step: int, metrics: dict[str, float]) -> None:
        if step == 3:
            actor = state["orch"].rollout_actors[0]
            old_pid = ray.get(actor.pid.remote())
            ray.kill(actor, no_restart=False)
            # Hold the driver until the new process is up, so it has work left to do
            # (otherwise rollout-1 alone may finish these short batches first).
            while True:
                try:
                    if ray.get(actor.pid.remote(), timeout=60) != old_pid:
                        break
                except ray.exceptions.RayActorError:
                    time.sleep(0.1)

    orch = build("trainer.steps=12", "orchestrator.eval_every=0", *lagged, on_metrics=kill_at_step_3)
    state["orch"] = orch
    try:
        history = orch.run(12)
        stats = orch.buffer_stats()
    finally:
        orch.close()
    assert len(history.steps) == 12
    assert orch.restarts >= 1 and history.steps[-1]["faults/rollout_restarts"] >= 1
    assert any(e.phase == "restart" and e.worker == "rollout-0" for e in history.timeline)
    # rollout-0 served chunks from a new process after its restart, with verified weights.
    served = [r for r in orch.weight_log if r.worker == "rollout-0"]
    assert len({r.pid for r in served}) == 2 and all(r.checksum == r.trainer_checksum for r in served)
    # Every experience accounted for: each batch trained whole, nothing lost or doubled.
    assert stats["pushed"] == stats["sampled"] == 12 * 64 and accounting_holds(stats)
    assert all(len(taus) == 64 and max(taus) <= 1 for taus in history.staleness)
    # Chunks are seeded by position, not by worker: the run is the one without the kill.
    _, reference, _ = run_to_end(12, *lagged)
    for key in ("reward/mean", "loss/policy", "policy/clip_frac"):
        assert [s[key] for s in history.steps] == [s[key] for s in reference.steps], key


def test_a_restored_ray_run_repeats_the_uninterrupted_one():
    overrides = ["orchestrator.mode=lagged", "orchestrator.lag=1", "trainer.steps=6", "orchestrator.eval_every=3"]
    keys = ("loss/policy", "reward/mean", "staleness/max", "eval/accuracy")

    def curves(history):  # type: ignore[no-untyped-def]
        return [{k: s[k] for k in keys if k in s} for s in history.steps]

    orch = build(*overrides)
    try:
        reference, final = orch.run(6), orch.trainer_checksums[6]
    finally:
        orch.close()
    state = checkpoint_then_die(build(*overrides), at=3, steps=6)
    assert state["steps_done"] in (3, 4)
    second = build(*overrides)
    try:
        second.restore(state)
        history = second.run(6)
        assert curves(history) == curves(reference) and history.staleness == reference.staleness
        assert second.trainer_checksums[6] == final
    finally:
        second.close()


def checkpoint_then_die(runtime, at: int, steps: int):  # type: ignore[no-untyped-def]
    """Run ``runtime`` towards ``steps``; after step ``at`` checkpoint it (the state may
    follow step ``at`` + 1, already queued on the trainer), then "die"; the state as a
    checkpoint file would give it back."""
    box = {}

    def after_step(done: int) -> None:
        if done == at:
            runtime.checkpoint(lambda state: box.update(state=roundtrip(state)))
            raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            runtime.run(steps, after_step)
    finally:
        runtime.close()
    return box["state"]


def roundtrip(state):  # type: ignore[no-untyped-def]
    """As a checkpoint file would give it back (its attached folders copied out: the
    runtime removes them once the write returns)."""
    import io
    import shutil
    import tempfile

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    out = torch.load(buffer, weights_only=True)
    for name, folder in out.get("attachments", {}).items():
        out["attachments"][name] = str(shutil.copytree(folder, Path(tempfile.mkdtemp(prefix="shards-")) / name))
    return out
