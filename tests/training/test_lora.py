"""LoRA through peft: only the adapters train and are checkpointed; the published weights
are the base model's, adapters merged, and an engine built from the base loads them."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrlhf.models import weights_checksum
from asyncrlhf.training import OptimConfig, TrainerWorker
from asyncrlhf.training.lora import LoraSettings, apply_lora, merged_state_dict
from asyncrlhf.types import Experience
from tests.helpers import small_model

pytest.importorskip("peft")

SETTINGS = LoraSettings(r=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _batch() -> list[Experience]:
    out = []
    for i in range(8):
        prompt, response = (
            torch.tensor([1, 10 + i, 20 + i % 3]),
            torch.tensor([5 + (i + j) % 7 for j in range(2 + i % 4)]),
        )
        out.append(
            Experience(prompt, response, torch.full((len(response),), -3.0), float(i % 2), 0, i // 2, 1.0 - i % 2)
        )
    return out


def _trainer(model) -> TrainerWorker:  # type: ignore[no-untyped-def]
    return TrainerWorker(model, 0, "ppo", {}, OptimConfig(lr=5e-2), seed=0, skip_zero_advantage=False)


@pytest.fixture
def base():  # type: ignore[no-untyped-def]
    model, _ = small_model()
    return model


def test_the_published_weights_are_the_merged_base_model(base):
    model = apply_lora(copy.deepcopy(base), SETTINGS)
    with torch.no_grad():  # adapters start as a no-op (B = 0): give them something to merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(p.numel()))
    merged = merged_state_dict(model)
    assert merged.keys() == base.state_dict().keys()
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-7)
    engine_model = copy.deepcopy(base)
    engine_model.load_state_dict(merged)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    torch.testing.assert_close(engine_model(ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert weights_checksum(engine_model) == weights_checksum(merged)


def test_only_the_adapters_train_and_only_targeted_weights_move(base):
    trainer = _trainer(apply_lora(copy.deepcopy(base), SETTINGS))
    adapters = [p for n, p in trainer.model.named_parameters() if "lora_" in n]
    assert [p for g in trainer.optimizer.param_groups for p in g["params"]] == adapters
    before = trainer.state_dict()
    for _ in range(3):
        trainer.step(_batch())
    after = trainer.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    targeted = {k for k in before if k.rsplit(".", 2)[-2] in SETTINGS.target_modules}
    assert moved == targeted and len(moved) == 3 * base.config.num_hidden_layers
    assert trainer.checksum() == weights_checksum(after)


def test_a_checkpoint_holds_the_adapters_alone_and_resumes_exactly(base):
    trainer = _trainer(apply_lora(copy.deepcopy(base), SETTINGS))
    trainer.step(_batch())
    state = copy.deepcopy(trainer.state())  # it holds the live optimiser tensors, as a checkpoint writes them at once
    assert state["model"] and all("lora_" in k for k in state["model"])
    assert sum(v.numel() for v in state["model"].values()) < 0.1 * sum(p.numel() for p in base.parameters())
    expected = trainer.step(_batch())
    resumed = _trainer(apply_lora(copy.deepcopy(base), SETTINGS))
    resumed.restore(state)
    assert resumed.step(_batch()) == expected
    assert resumed.checksum() == trainer.checksum()


def test_target_modules_that_match_nothing_are_named(base):
    with pytest.raises(ValueError, match=r"target_modules: \['qkv'\] match no module of the model \(its linear"):
        apply_lora(copy.deepcopy(base), LoraSettings(target_modules=("q_proj", "qkv")))
