"""LoRA on a trainer group (2 gloo ranks, FSDP2 and DDP): the update, the published
(merged) weights and the adapter are the one-process LoRA trainer's; the sharded
checkpoint holds the adapters alone and a fresh group resumes from it exactly."""

from __future__ import annotations

import copy
import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrlhf.training import OptimConfig, TrainerWorker
from asyncrlhf.training.lora import LoraSettings, apply_lora
from tests.helpers import free_port, spawn_ranks
from tests.training.test_sharded import _batch, _grads, _model

pytest.importorskip("peft")

SETTINGS = LoraSettings(r=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
TOL = 1e-6  # float64


def _lora(model: Any) -> Any:
    torch.manual_seed(7)  # the adapters' A (peft draws it from the global generator)
    out = apply_lora(copy.deepcopy(model), SETTINGS)
    with torch.no_grad():  # B starts at 0 (a no-op): give the merge something to do
        for name, p in out.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(p.numel()))
    return out


def _trainer(cls: type, model: Any, tokenizer: Any, **extra: Any) -> Any:
    optim = OptimConfig(lr=1e-2, mini_batches=2)
    return cls(_lora(model), tokenizer.pad_token_id, "grpo", {}, optim, seed=5, **extra)


def _rank(rank: int, world: int, port: int, parallel: str, out: str, folder: str) -> None:
    import torch.distributed as dist

    from asyncrlhf.training.sharded import ShardedTrainer

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", timeout=timeout, world_size=world, rank=rank)
    try:
        model, tokenizer = _model(torch.float64)
        batch = _batch(model, tokenizer)
        trainer = _trainer(ShardedTrainer, model, tokenizer, parallel=parallel)
        metrics = [trainer.step(batch) for _ in range(2)]
        result = {"metrics": metrics, "grads": _grads(trainer.model), "layout": trainer.weights_layout()}
        result.update(published=trainer.state_dict(), adapter=trainer.adapter())
        trainer.save_sharded(folder)
        saved = trainer.state()
        result["after"] = trainer.step(batch)
        fresh = _trainer(ShardedTrainer, model, tokenizer, parallel=parallel)
        fresh.load_sharded(folder)
        fresh.restore(saved)
        result["resumed"] = fresh.step(batch)
        if rank == 0:
            torch.save(result, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # see tests/training/test_sharded.py


def _group(world: int, parallel: str, tmp_path: Path) -> dict[str, Any]:
    out, folder = str(tmp_path / "out.pt"), str(tmp_path / "shards")
    spawn_ranks(_rank, world, free_port(), parallel, out, folder)
    result = torch.load(out, weights_only=False)
    result["saved"] = list(_saved_keys(folder))
    return result


def _saved_keys(folder: str) -> list[str]:
    import torch.distributed.checkpoint as dcp

    return list(dcp.FileSystemReader(folder).read_metadata().state_dict_metadata)


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_a_lora_group_update_equals_the_one_process_lora_update(parallel, tmp_path):
    torch.set_num_threads(1)
    model, tokenizer = _model(torch.float64)
    batch = _batch(model, tokenizer)
    group = _group(2, parallel, tmp_path)
    one = _trainer(TrainerWorker, model, tokenizer, share_prompts=False)
    metrics = [one.step(batch) for _ in range(2)]
    for ours, theirs in zip(group["metrics"], metrics, strict=True):
        assert ours == pytest.approx(theirs, rel=TOL, abs=TOL)
    grads = _grads(one.model)
    assert grads and all("lora_" in k for k in grads)  # only the adapters train
    assert group["grads"].keys() == grads.keys()
    for key, value in grads.items():
        torch.testing.assert_close(group["grads"][key], value, rtol=TOL, atol=TOL)
    published = one.state_dict()  # the base model's names, adapters merged
    assert group["layout"] == [(k, tuple(v.shape), v.dtype) for k, v in published.items()]
    assert group["published"].keys() == published.keys() == model.state_dict().keys()
    for key, value in published.items():
        torch.testing.assert_close(group["published"][key], value, rtol=TOL, atol=TOL)
    adapter = one.adapter()
    assert group["adapter"]["config"] == adapter["config"]
    assert group["adapter"]["weights"].keys() == adapter["weights"].keys()
    for key, value in adapter["weights"].items():
        torch.testing.assert_close(group["adapter"]["weights"][key], value, rtol=TOL, atol=TOL)
    # the checkpoint holds the adapters (and their optimiser state), not the frozen base;
    # torch's state dict keeps a tied weight's name though (lm_head is the embedding here)
    weights = [k for k in group["saved"] if k.startswith("model.")]
    assert any("lora_" in k for k in weights)
    assert [k for k in weights if "lora_" not in k] == ["model.base_model.model.lm_head.weight"]
    assert group["resumed"] == group["after"]  # exact
