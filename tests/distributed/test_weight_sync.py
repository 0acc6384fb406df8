"""Weights over a process group (runtime.weight_sync: collective): the channel itself
(buckets, dtypes, the timeout) in threads of this process, and real Ray runs that give
exactly the object-store run, resume exactly, and stop loudly when a member dies."""

from __future__ import annotations

import threading
import time

import pytest
import ray
import torch

from asyncrlhf.distributed.weights import WeightChannel, _buckets, choose_sync, layout_of
from tests.distributed.test_ray_runtime import checkpoint_then_die
from tests.distributed.test_trainer_group import SMALL, SPEC
from tests.helpers import free_port

STATE = {
    "a": torch.arange(10, dtype=torch.float32),
    "b": torch.randn(300, 40),
    "c": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    "d": torch.randn(7, dtype=torch.float64),
    "e": torch.randn(5, 5),
}


def _channels(world: int, timeout_s: float, bucket_mb: float) -> list[WeightChannel]:
    port, out = free_port(), [None] * world

    def join(rank: int) -> None:
        out[rank] = WeightChannel("127.0.0.1", port, rank, world, layout_of(STATE), timeout_s, 2, bucket_mb)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(out), "a member did not join"
    return out  # type: ignore[return-value]


def test_buckets_hold_one_dtype_each_and_at_most_their_size():
    layout = layout_of(STATE)
    buckets = _buckets(layout, 4096)
    assert sorted(i for b in buckets for i in b) == list(range(len(layout)))
    for bucket in buckets:
        assert len({layout[i][2] for i in bucket}) == 1
    assert [0] in buckets and [1] in buckets  # "b" (48 KB) alone; "a" could not join it
    assert [2] in buckets and [3] in buckets and [4] in buckets  # int64, float64, then the next float32


@pytest.mark.parametrize("bucket_mb", [0.001, 256.0])  # many buckets, or one per dtype
def test_a_broadcast_delivers_every_tensor_exactly_and_keeps_the_last_versions(bucket_mb):
    sender, *receivers = _channels(3, 30.0, bucket_mb)
    for version in (1, 2, 3):
        state = {k: v + version if v.is_floating_point() else v * version for k, v in STATE.items()}
        sender.stage(version, state)
        threads = [threading.Thread(target=r.receive, args=(version,)) for r in receivers]
        for t in threads:
            t.start()
        sender.send(version)
        for t in threads:
            t.join(timeout=30)
        for r in receivers:
            got = r.wait(version)
            assert got.keys() == state.keys()
            for k in state:
                assert got[k].dtype == state[k].dtype and torch.equal(got[k], state[k]), k
    assert list(sender.versions) == [2, 3] and all(list(r.versions) == [2, 3] for r in receivers)


def test_a_broadcast_that_never_comes_fails_within_the_timeout():
    _, receiver = _channels(2, 2.0, 256.0)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        receiver.receive(1)
    with pytest.raises(RuntimeError, match="receiving weights failed"):
        receiver.wait(1)
    assert time.monotonic() - start < 20


def test_a_member_that_never_joins_fails_the_group_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timeout"):
        WeightChannel("127.0.0.1", free_port(), 0, 2, layout_of(STATE), 2.0, 2)
    assert time.monotonic() - start < 20


def test_auto_chooses_by_size_and_bad_modes_are_named():
    assert choose_sync("auto", 1_400_000) == "object_store" and choose_sync("auto", 2 << 30) == "collective"
    assert choose_sync("collective", 10) == "collective"
    with pytest.raises(ValueError, match=r"weight_sync must be .* got 'nccl'"):
        choose_sync("nccl", 10)


# --------------------------------------------------------------- on Ray


def build(sync: str, ranks: int = 1):  # type: ignore[no-untyped-def]
    from pipelines.run import build_runtime
    from pipelines.spec import load_spec

    return build_runtime(load_spec(SPEC, [*SMALL, f"runtime.trainer.ranks={ranks}", f"runtime.weight_sync={sync}"]))


def run(sync: str, ranks: int = 1, steps: int = 6):  # type: ignore[no-untyped-def]
    runtime = build(sync, ranks)
    try:
        return runtime.run(steps), dict(runtime.trainer_checksums), list(runtime.weight_log)
    finally:
        runtime.close()


@pytest.mark.usefixtures("ray_cluster")
# one trainer process: nightly; CI runs the group's (rank 0 of 2 sends)
@pytest.mark.parametrize("ranks", [pytest.param(1, marks=pytest.mark.nightly), 2])
def test_a_collective_run_is_the_object_store_run(ranks):
    (store, store_sums, _), (group, group_sums, log) = run("object_store", ranks), run("collective", ranks)
    assert store.summary["weights/collective"] == 0.0 and group.summary["weights/collective"] == 1.0
    assert group.summary["weights/broadcast_s"] > 0.0
    assert [s["reward/mean"] for s in group.steps] == [s["reward/mean"] for s in store.steps]
    assert group_sums == store_sums  # every version's weights, bit for bit
    assert len(log) >= 6 and all(r.checksum == r.trainer_checksum for r in log)  # every load verified


@pytest.mark.nightly  # CI: the collective run equals the object-store run; resumes are exact (test_ray_runtime)
@pytest.mark.usefixtures("ray_cluster")
def test_a_collective_run_resumes_exactly():
    reference, sums, _ = run("collective")
    state = checkpoint_then_die(build("collective"), at=3, steps=6)
    second = build("collective")
    try:
        second.restore(state)
        history = second.run(6)
        assert [s["loss/policy"] for s in history.steps] == [s["loss/policy"] for s in reference.steps]
        assert second.trainer_checksums[6] == sums[6]
    finally:
        second.close()


@pytest.mark.usefixtures("ray_cluster")
def test_a_rollout_actor_that_dies_stops_a_collective_run_naming_it():
    runtime = build("collective")

    def after_step(done: int) -> None:
        if done == 2:
            ray.kill(runtime.rollout_actors[0], no_restart=True)

    try:
        with pytest.raises(RuntimeError, match=r"rollout-0 died; with runtime\.weight_sync 'collective'"):
            runtime.run(8, after_step)
    finally:
        runtime.close()
