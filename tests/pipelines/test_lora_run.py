"""A LoRA quick start end to end on the local runtime: the engine runs on the merged
weights of every version (its loads are verified against the trainer's checksum), the
trainer's checkpoint holds the adapters alone, the run's policy is the merged base model."""

from __future__ import annotations

import subprocess

import pytest

from asyncrlhf.models import weights_checksum
from pipelines.run import build_runtime
from pipelines.spec import load_spec
from tests.pipelines.conftest import REPO

pytest.importorskip("peft")


def test_a_lora_run_publishes_merged_weights_and_checkpoints_the_adapters():
    overrides = ["model.lora.r=8", "trainer.batch_size=64", "task.eval_size=20", "orchestrator.eval_every=5"]
    runtime = build_runtime(load_spec(REPO / "experiments" / "quickstart.yaml", overrides))
    try:
        history = runtime.run(10)
        assert len(history.steps) == 10 and all(0.0 <= s["reward/mean"] <= 1.0 for s in history.steps)
        trainer, engine = runtime.trainer, runtime.engine
        policy = runtime.policy_state()
        assert policy.keys() == engine.model.state_dict().keys()  # the base model's names
        assert trainer.checksum() == weights_checksum(policy)
        state = trainer.state()["model"]
        assert state and all("lora_" in k for k in state)
        start = load_spec(REPO / "experiments" / "quickstart.yaml")  # the same start, no adapters
        base = build_runtime(start)
        try:
            moved = [k for k, v in base.policy_state().items() if not (v == policy[k]).all()]
        finally:
            base.close()
        assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved)
    finally:
        runtime.close()


def test_a_tracked_lora_run_logs_the_merged_policy_and_the_adapter_peft_loads(store, tmp_path):
    import copy

    import torch
    from mlflow import MlflowClient
    from peft import PeftModel

    from asyncrlhf.models import load_pretrained
    from pipelines.run import run_experiment

    overrides = ["model.lora.r=8", "trainer.steps=6", "trainer.batch_size=64", "task.eval_size=20"]
    result = run_experiment(load_spec(REPO / "experiments" / "quickstart.yaml", overrides))
    client = MlflowClient(store)
    policy = load_pretrained(client.download_artifacts(result.run_id, "policy", str(tmp_path)))[0]
    adapter = client.download_artifacts(result.run_id, "adapter", str(tmp_path))
    start = load_pretrained(str(REPO / "asyncrlhf" / "checkpoints" / "tiny-addition"))[0]
    adapted = PeftModel.from_pretrained(copy.deepcopy(start), adapter)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    torch.testing.assert_close(adapted(input_ids=ids).logits, policy(ids).logits, rtol=0, atol=1e-5)
    assert not torch.equal(start(ids).logits, policy(ids).logits)  # it trained


@pytest.mark.nightly  # a refusal that needs a finished run first
def test_a_one_process_lora_run_resumed_onto_a_trainer_group_exits_2_in_one_line(store):
    """A one-process LoRA checkpoint holds the adapters under peft's names, not a group's
    shards: ``--resume`` refuses to split it onto ranks before anything starts."""
    from mlflow import MlflowClient

    from tests.pipelines.conftest import cli, env

    spec = str(REPO / "experiments" / "quickstart.yaml")
    sets = ["model.lora.r=8", "runtime.kind=ray", "runtime.num_cpus=2", "trainer.steps=2", "trainer.batch_size=64"]
    sets += ["task.eval_size=20", "orchestrator.eval_every=2"]
    args = [arg for s in sets for arg in ("--set", s)]
    first = subprocess.run([*cli(), "run", spec, *args], capture_output=True, text=True, env=env(), timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    more = ["--set", "trainer.steps=4", "--set", "runtime.trainer.ranks=2", "--set", "runtime.num_cpus=3"]
    done = subprocess.run(
        [*cli(), "run", spec, "--resume", run.info.run_id, *args, *more],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "runtime.trainer.ranks=2: a one-process LoRA checkpoint does not resume onto a trainer group" in lines[0]
    assert client.get_run(run.info.run_id).info.status == "FINISHED"  # not reopened
