from __future__ import annotations

import copy

import pytest
import torch

from asyncrlhf.losses import group_advantages
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.training import OptimConfig, TrainerWorker, sequence_logprobs
from asyncrlhf.types import Experience, collate
from tests.helpers import even_first_token, small_model

PROMPTS = [torch.tensor([1, 10 + i, 20 + i]) for i in range(4)]
G = 4


def rollout(engine: HFEngine) -> list[Experience]:
    samples = engine.generate(PROMPTS, G)
    ids = torch.nn.utils.rnn.pad_sequence([s.response_ids for s in samples], batch_first=True)
    rewards = even_first_token(ids, None, 2)
    advantages = group_advantages(rewards, G)
    return [
        Experience(s.prompt_ids, s.response_ids, s.logprobs, float(r), s.policy_version, s.prompt_index, float(a))
        for s, r, a in zip(samples, rewards, advantages, strict=True)
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_the_engine(temperature):
    model, tok = small_model()
    engine = HFEngine(
        model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=8, temperature=temperature), seed=1
    )
    experiences = rollout(engine)
    batch = collate(experiences, tok.pad_token_id)
    with torch.no_grad():
        recomputed = sequence_logprobs(model, batch, temperature)
    delta = (recomputed - batch.old_logprobs).abs()[batch.response_mask]
    assert delta.max().item() < 1e-4
    trainer = TrainerWorker(model, tok.pad_token_id, "ppo", temperature=temperature)
    metrics = trainer.step(experiences)
    assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)  # the first PPO ratio is 1
    assert metrics["policy/clip_frac"] == 0.0


@pytest.mark.parametrize("algorithm", ["ppo", "m2po", "grpo", "gspo", "decoupled_ppo"])
def test_a_few_steps_change_every_parameter(algorithm):
    model, tok = small_model()
    before = copy.deepcopy(model.state_dict())
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=2)
    trainer = TrainerWorker(model, tok.pad_token_id, algorithm, optim=OptimConfig(lr=1e-2))
    for _ in range(3):
        trainer.step(rollout(engine))
        engine.load_weights(trainer.state_dict(), trainer.version)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []
    assert trainer.version == 3


def test_non_finite_loss_skips_the_step_and_leaves_weights_untouched():
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=3)
    experiences = rollout(engine)
    experiences[0].logprobs[0] = float("nan")
    trainer = TrainerWorker(model, tok.pad_token_id, "ppo")
    before = trainer.checksum()
    metrics = trainer.step(experiences)
    assert trainer.checksum() == before
    assert metrics["train/skipped_steps"] == 1.0 and trainer.skipped_steps == 1
    assert trainer.version == 1  # a version per step, even a skipped one (weights equal)


def test_mini_batches_and_epochs():
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(ppo_epochs=2, mini_batches=4, lr=1e-2))
    metrics = trainer.step(rollout(engine))
    assert metrics["train/skipped_updates"] == 0.0
    assert metrics["policy/ratio_max"] > 1.0  # later updates see the policy moved


def test_decoupled_ppo_gets_the_policy_of_the_step_start_as_proximal():
    """On fresh data π_prox = π_behav (weight 1, M2 0 between them); over 8 updates the
    proximal policy stays the step's start, so later updates see π_θ/π_prox move."""
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "decoupled_ppo", optim=OptimConfig(ppo_epochs=2, mini_batches=4,
                            lr=1e-2))  # fmt: skip
    metrics = trainer.step(rollout(engine))
    assert metrics["policy/m2_behav_prox"] < 1e-8 and metrics["policy/behav_weight_mean"] == pytest.approx(1, abs=1e-4)
    assert metrics["policy/ratio_max"] > 1.0 and metrics["train/skipped_updates"] == 0.0


def test_save_load_continue_equals_not_stopping(tmp_path):
    def setup():  # type: ignore[no-untyped-def]
        model, tok = small_model()
        engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=5)
        optim = OptimConfig(mini_batches=2, lr=1e-2, warmup_updates=8)  # still warming up at the third step
        trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=optim, seed=9)
        return engine, trainer

    engine, trainer = setup()
    batches = [rollout(engine) for _ in range(3)]
    trainer.step(batches[0])
    trainer.step(batches[1])
    trainer.save(tmp_path / "ckpt.pt")
    expected = trainer.step(batches[2])

    _, resumed = setup()
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.version == 2
    got = resumed.step(batches[2])
    assert got["loss/policy"] == expected["loss/policy"]
    # Updates 4 and 5 of the warm-up (the step's mean lr), on both: AdamW's step count is the clock.
    assert got["train/lr"] == expected["train/lr"] == pytest.approx(1e-2 * (5 + 6) / 2 / 8)
    assert resumed.checksum() == trainer.checksum()


def test_the_warm_up_raises_the_learning_rate_linearly_then_holds_it():
    optim = OptimConfig(lr=1e-3, warmup_updates=4)
    assert [optim.lr_at(u) for u in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert OptimConfig(lr=1e-3).lr_at(0) == 1e-3  # none by default
    with pytest.raises(ValueError, match="warmup_updates"):
        OptimConfig(warmup_updates=-1)
    # Then a decay to the floor at total_updates, held there after.
    linear = OptimConfig(lr=1e-3, warmup_updates=2, decay="linear", total_updates=6, min_lr_ratio=0.2)
    assert [linear.lr_at(u) for u in range(8)] == pytest.approx([5e-4, 1e-3, 1e-3, 8e-4, 6e-4, 4e-4, 2e-4, 2e-4])
    cosine = OptimConfig(lr=1e-3, decay="cosine", total_updates=4)
    assert [cosine.lr_at(u) for u in range(5)] == pytest.approx([1e-3, 8.5355e-4, 5e-4, 1.4645e-4, 0.0], abs=1e-8)
    with pytest.raises(ValueError, match="needs total_updates"):
        OptimConfig(warmup_updates=4, decay="cosine", total_updates=4)
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(lr=1e-2, warmup_updates=3))
    lrs = [trainer.step(rollout(engine))["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])
    # A frozen first parameter (no optimiser state) does not stop the clock: once it did.
    model, tok = small_model()
    next(model.parameters()).requires_grad_(False)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(lr=1e-2, warmup_updates=3))
    lrs = [trainer.step(rollout(engine))["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])


def test_missing_advantages_and_bad_settings_fail_clearly():
    model, tok = small_model()
    exp = Experience(torch.tensor([1]), torch.tensor([5]), torch.tensor([-1.0]), 1.0, 0, "p")
    with pytest.raises(ValueError, match="advantage"):
        TrainerWorker(model, tok.pad_token_id).step([exp])
    with pytest.raises(ValueError, match="algorithm"):
        TrainerWorker(model, tok.pad_token_id, "dpo")
    with pytest.raises(ValueError, match="unknown options"):
        TrainerWorker(model, tok.pad_token_id, "ppo", {"m2_threshold": 0.1})
    with pytest.raises(ValueError, match="lr"):
        TrainerWorker(model, tok.pad_token_id, optim=OptimConfig(lr=0.0))
