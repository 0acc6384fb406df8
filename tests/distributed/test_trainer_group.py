"""A trainer group of 2 ranks on the real local Ray cluster (gloo, FSDP2): the same run as
one trainer process, within float rounding, and a sharded checkpoint that resumes it."""

from __future__ import annotations

import pytest

from pipelines.run import build_runtime
from pipelines.spec import load_spec
from tests.distributed.test_ray_runtime import checkpoint_then_die
from tests.pipelines.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_cluster")

SPEC = REPO / "experiments" / "quickstart.yaml"
SMALL = [
    "runtime.kind=ray",
    "runtime.torch_threads=1",
    "runtime.trainer.num_cpus=0.5",
    "runtime.rollout.num_cpus=0.5",
    "rollout.workers=1",
    "trainer.batch_size=64",
    "task.eval_size=20",
    "orchestrator.eval_every=5",
]


def build(ranks: int, *overrides: str):  # type: ignore[no-untyped-def]
    return build_runtime(load_spec(SPEC, [*SMALL, f"runtime.trainer.ranks={ranks}", *overrides]))


def run(ranks: int, steps: int):  # type: ignore[no-untyped-def]
    runtime = build(ranks)
    try:
        return runtime.run(steps), runtime.trainer_checksums[steps]
    finally:
        runtime.close()


def test_two_ranks_give_the_one_process_run():
    (one, _), (two, _) = run(1, 10), run(2, 10)
    assert two.summary["trainer/ranks"] == 2.0 and one.summary["trainer/ranks"] == 1.0
    assert [s["reward/mean"] for s in two.steps] == [s["reward/mean"] for s in one.steps]  # the same samples
    for a, b in zip(one.steps, two.steps, strict=True):
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4)
        assert b["loss/policy"] == pytest.approx(a["loss/policy"], abs=1e-6)
    assert [s.get("eval/accuracy") for s in two.steps] == [s.get("eval/accuracy") for s in one.steps]


def test_a_sharded_checkpoint_resumes_the_group_run_exactly():
    reference, final = run(2, 6)
    state = checkpoint_then_die(build(2), at=3, steps=6)
    assert set(state["attachments"]) == {"trainer"}
    second = build(2)
    try:
        second.restore(state)
        history = second.run(6)
        assert [s["loss/policy"] for s in history.steps] == [s["loss/policy"] for s in reference.steps]
        assert second.trainer_checksums[6] == final
    finally:
        second.close()
